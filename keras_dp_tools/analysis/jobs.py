"""Jobs in a log dir: which runs are one job's workers, merged on request.

Every worker of a multi-worker job writes its own records; the report sees one job
only where their ``run`` ids agree. Since the workers agree on their id at the start
of ``fit`` (``capture.job_identity``) they mostly do; records written before that,
or by workers whose agreement failed, hold one run per worker. Such runs are found
here (``split_runs``) by what one job's workers share:

- the same cluster (the header's ``cluster`` fingerprint; records without it: the
  same ``workers`` count above 1),
- disjoint worker indexes that do not exceed that count,
- overlapping times: each run's span from its first header to its last record,
  allowed a gap of ``CLOCK_TOLERANCE_S`` for clocks that disagree between hosts.

Several candidates for one worker pair up closest in time first (two jobs one after
the other stay two). ``merge_jobs`` renames the runs of a group to one id (the run of
its lowest worker) before the frames are built, so the cross-worker analysis sees one
job, and returns the facts (``JobMerge``) that ``analysis.job_advice`` turns into
findings.

Pure functions over the record frames; no TensorFlow.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np
import pandas as pd

# Seconds two runs' spans may lie apart and still be one job: hosts' clocks disagree.
CLOCK_TOLERANCE_S = 30.0
SPAN_COLUMNS = ["run", "worker", "workers", "cluster", "strategy", "start", "end", "source"]


class MergeRunsError(ValueError):
    """``merge_runs`` names runs that cannot be merged as given (``merge_jobs``)."""


@dataclass(frozen=True)
class JobMerge:
    """What ``merge_jobs`` found and did: the facts the job findings are made of
    (``analysis.job_advice.records_findings``).

    Attributes:
        spans: ``run_spans`` of the records after the merge.
        split: groups of runs that still look like one job's workers (``split_runs``).
        merged: the groups merged, each as first recorded (its first run names it).
    """

    spans: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=SPAN_COLUMNS))
    split: list[list[str]] = field(default_factory=list)
    merged: list[list[str]] = field(default_factory=list)

    def for_run(self, run: str) -> JobMerge:
        """The facts about one run id: its spans and those of the runs it looks split
        from, its split group and its merged group."""
        split = [group for group in self.split if run in group]
        runs = {run, *(other for group in split for other in group)}
        spans = self.spans[self.spans["run"].isin(runs)].reset_index(drop=True)
        merged = [group for group in self.merged if group[0] == run]
        return JobMerge(spans, split, merged)


def merge_jobs(
    records: dict[str, pd.DataFrame],
    merge_runs: str | Sequence[Sequence[str]] | None = None,
    detected_need_cluster: bool = False,
) -> tuple[dict[str, pd.DataFrame], JobMerge]:
    """The records with runs merged as ``merge_runs`` says, and what was found.

    Args:
        records: the records by type (``analysis.record_tables.records_by_type``).
        merge_runs: None (merge nothing; runs that look split are reported),
            ``"detected"`` (merge the groups ``split_runs`` finds), or groups of run
            ids to merge, e.g. ``[["run-a", "run-b"]]``. A merged run keeps the id of
            its lowest worker's run.
        detected_need_cluster: with ``"detected"``, merge only groups whose headers
            share a cluster fingerprint; groups found by their ``workers`` count alone
            (older records) could be two jobs of one size at once, and stay apart.

    Returns:
        ``(records, JobMerge)``: the records (the ones given where nothing is merged).

    Raises:
        MergeRunsError: ``merge_runs`` is none of the above, names runs the records do
            not hold, a run twice, or runs that share a worker index.

    Example:

    ```python
    from keras_dp_tools.analysis.jobs import merge_jobs
    from keras_dp_tools.analysis.record_tables import records_by_type

    records, found = merge_jobs(records_by_type([("runs/job/keras_dp/worker-0.jsonl", 0)]))
    print(found.split)
    ```
    """
    spans = run_spans(records)
    split = split_runs(spans)
    detected = split
    if detected_need_cluster:
        runs = runs_of_spans(spans)
        detected = [group for group in split if runs[group[0]]["cluster"] is not None]
    groups = _groups_to_merge(merge_runs, detected, spans)
    if groups:
        records = merge_run_ids(records, groups)
        spans = run_spans(records)
        # Found again on the merged runs: a merge named by hand may differ from what
        # was found before it (part of a group, or runs found with others).
        split = split_runs(spans)
    return records, JobMerge(spans, split, groups)


def _groups_to_merge(merge_runs, detected: list[list[str]], spans: pd.DataFrame):
    """The groups to merge, each ordered by its runs' lowest worker (the first names
    the merged run); user groups checked (``MergeRunsError``)."""
    if merge_runs is None:
        return []
    if isinstance(merge_runs, str):
        if merge_runs != "detected":
            raise MergeRunsError(
                f"merge_runs must be None, 'detected' or groups of run ids (e.g. "
                f"[['run-a', 'run-b']]), received {merge_runs!r}."
            )
        return detected
    groups = [list(group) for group in merge_runs]
    workers = {run: set(rows["worker"]) for run, rows in spans.groupby("run", sort=False)}
    named: dict[str, list[str]] = {}
    for group in groups:
        if isinstance(group, str) or len(group) < 2:
            raise MergeRunsError(
                f"Each group in merge_runs lists two or more run ids, received {group!r} "
                "(give [['run-a', 'run-b']] for one group)."
            )
        unknown = [run for run in group if run not in workers]
        if unknown:
            raise MergeRunsError(
                f"merge_runs names run(s) {', '.join(unknown)} that the records do not "
                f"hold; the runs are: {', '.join(sorted(workers))}."
            )
        for run in group:
            if run in named:
                raise MergeRunsError(
                    f"merge_runs names run {run} twice (in {named[run]!r} and {group!r}); "
                    "a run is one job's: name it in one group only."
                )
            named[run] = group
        for run_a, run_b in combinations(group, 2):
            shared = workers[run_a] & workers[run_b]
            if shared:
                raise MergeRunsError(
                    f"merge_runs would merge runs {run_a} and {run_b}, which both hold "
                    f"{workers_text(shared)}: one job has one worker of each index, so "
                    "they are different jobs (or a restart). Merge only runs with "
                    "disjoint workers (the split-runs finding names them), or load the "
                    "jobs apart."
                )
    return [sorted(group, key=lambda run: min(workers[run])) for group in groups]


def run_spans(records: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per run and worker with a header: its ``workers`` count and ``cluster``
    (the last header's), ``start`` (its first header's time) and ``end`` (its last
    record's time, a step's end), and the records file.

    Args:
        records: the records by type (``record_tables.records_by_type``).

    Returns:
        A DataFrame with ``SPAN_COLUMNS``.
    """
    headers = records.get("header")
    if headers is None or headers.empty:
        return pd.DataFrame(columns=SPAN_COLUMNS)
    headers = headers.reindex(
        columns=["run", "worker", "workers", "cluster", "strategy", "time", "source"]
    )
    keys = ["run", "worker"]
    spans = headers.groupby(keys, sort=False).agg(
        workers=("workers", "last"),
        cluster=("cluster", "last"),
        strategy=("strategy", "last"),
        start=("time", "min"),
        source=("source", "last"),
    )
    ends = [headers.groupby(keys)["time"].max()]
    for record_type, frame in records.items():
        if record_type in ("header", "worker_exit") or "time" not in frame or frame.empty:
            continue  # worker_exit: the launcher's clock, not the worker's
        ends.append(_latest_times(frame, record_type == "step"))
    end = pd.concat(ends, axis=1).max(axis=1)
    end.index = end.index.set_names(keys)
    spans["end"] = end.reindex(spans.index)
    spans = spans.reset_index()
    spans["worker"] = spans["worker"].astype("int64")
    return spans[SPAN_COLUMNS]


def _latest_times(frame: pd.DataFrame, steps: bool) -> pd.Series:
    """Per (run, worker): the latest time of the records, a step's end for steps.
    Grouped on integer codes, not on the run id strings (benchmarks/NOTES.md)."""

    def column(name, default):
        if name not in frame:
            return np.full(len(frame), default)
        return frame[name].to_numpy(dtype="float64", na_value=np.nan)

    times = column("time", np.nan)
    if steps:
        duration = column("step_ms", 0.0) * np.nan_to_num(column("steps", 1.0), nan=1.0) / 1e3
        times = times + np.nan_to_num(duration)
    runs, run_names = pd.factorize(frame["run"])
    workers, worker_names = pd.factorize(frame["worker"])
    group = runs * len(worker_names) + workers
    groups = len(run_names) * len(worker_names)
    # One unbuffered pass (fmax: NaN left out, as a grouped max does), not a pass per
    # group or a groupby's sort; the groups with records, by code.
    keyed = group >= 0  # an empty run id or worker (code -1) is in no group
    latest = np.full(groups, np.nan)
    np.fmax.at(latest, group[keyed], times[keyed])
    codes = np.flatnonzero(np.bincount(group[keyed], minlength=groups))
    index = pd.MultiIndex.from_arrays(
        [run_names.take(codes // len(worker_names)), worker_names.take(codes % len(worker_names))]
    )
    return pd.Series(latest[codes], index=index)


def runs_of_spans(spans: pd.DataFrame) -> dict[str, dict]:
    """Per run id of ``run_spans``: its ``workers`` count, worker ``indexes``,
    ``cluster`` (None: unrecorded) and its ``start`` and ``end``."""
    runs = {}
    for run, group in spans.groupby("run", sort=False):
        clusters = group["cluster"].dropna().unique()
        workers = float(pd.to_numeric(group["workers"], errors="coerce").max())
        if group["strategy"].astype(str).str.contains("ParameterServer").any():
            workers = 1.0  # only the coordinator records: its peers record nothing
        runs[run] = {
            "workers": workers,
            "indexes": frozenset(int(worker) for worker in group["worker"]),
            "cluster": clusters[0] if len(clusters) else None,
            "start": float(group["start"].min()),
            "end": float(group["end"].max()),
        }
    return runs


def _one_job(a: dict, b: dict) -> bool:
    """Whether two runs could be workers of one job (see the module docstring)."""
    if pd.isna(a["workers"]) or a["workers"] < 2 or a["workers"] != b["workers"]:
        return False
    if a["cluster"] != b["cluster"] or a["indexes"] & b["indexes"]:
        return False
    gap = max(a["start"], b["start"]) - min(a["end"], b["end"])
    return gap <= CLOCK_TOLERANCE_S


def split_runs(spans: pd.DataFrame) -> list[list[str]]:
    """Groups of runs that look like one job's workers recorded under separate run ids
    (see the module docstring); runs that already hold all their workers are never
    grouped.

    Args:
        spans: ``run_spans`` of the records.

    Returns:
        The groups, each ordered by its lowest worker, by start time.
    """
    runs = runs_of_spans(spans)
    incomplete = {
        run: info
        for run, info in runs.items()
        if pd.notna(info["workers"]) and len(info["indexes"]) < info["workers"]
    }
    pairs = sorted(
        (abs(a["start"] - b["start"]) + abs(a["end"] - b["end"]), run_a, run_b)
        for (run_a, a), (run_b, b) in combinations(incomplete.items(), 2)
        if _one_job(a, b)
    )
    group_of = {run: [run] for run in incomplete}
    for _, run_a, run_b in pairs:  # closest in time first
        first, second = group_of[run_a], group_of[run_b]
        if first is second:
            continue
        indexes = [runs[run]["indexes"] for run in first + second]
        union = frozenset().union(*indexes)
        if sum(map(len, indexes)) != len(union) or len(union) > runs[run_a]["workers"]:
            continue
        first.extend(second)
        for run in second:
            group_of[run] = first
    groups = {id(group): group for group in group_of.values() if len(group) > 1}
    return sorted(
        (sorted(group, key=lambda run: min(runs[run]["indexes"])) for group in groups.values()),
        key=lambda group: runs[group[0]]["start"],
    )


def merge_run_ids(
    records: Mapping[str, pd.DataFrame], groups: Sequence[Sequence[str]]
) -> dict[str, pd.DataFrame]:
    """The records with every run of a group renamed to the group's first run; headers
    keep the id they were recorded under in ``recorded_run``.

    Args:
        records: the records by type.
        groups: the runs to merge, each group's first naming the merged run (by
            ``merge_jobs``, the one of its lowest worker).

    Returns:
        A new dict of the records by type.
    """
    renamed = {run: group[0] for group in groups for run in group}
    merged = {}
    for record_type, frame in records.items():
        if "run" in frame:
            recorded = frame["run"]
            frame = frame.assign(run=recorded.map(renamed).fillna(recorded))
            if record_type == "header":
                frame = frame.assign(recorded_run=recorded)
        merged[record_type] = frame
    return merged


def workers_text(indexes) -> str:
    """Worker indexes as words: ``worker 3``, ``workers 0, 1 and 2``."""
    indexes = sorted(int(index) for index in indexes)
    if len(indexes) == 1:
        return f"worker {indexes[0]}"
    return "workers " + ", ".join(map(str, indexes[:-1])) + f" and {indexes[-1]}"
