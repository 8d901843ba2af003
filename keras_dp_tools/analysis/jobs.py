"""Jobs in a log dir: which runs are one job's workers, and what does not fit.

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
the other stay two). ``merge_run_ids`` renames the runs of a group to one id (the run
of its lowest worker) before the report's frames are built, so the cross-worker
analysis sees one job. ``load_job_frames`` does both for ``Report.load``, and
``job_findings`` says what it found: runs that look split (and how to merge them),
runs merged, workers missing or from another job, a run id two clusters share, and
clocks far apart.

Pure functions over the record frames; no TensorFlow.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from itertools import combinations

import numpy as np
import pandas as pd

from keras_dp_tools.analysis import frames as report_frames
from keras_dp_tools.analysis.summary import run_advice
from keras_dp_tools.analysis.worker_digest import LISTED_UP_TO, worker_names
from keras_dp_tools.common.findings import Advice, Finding
from keras_dp_tools.records.contract import RUN_ID_ENV

# Seconds two runs' spans may lie apart and still be one job: hosts' clocks disagree.
CLOCK_TOLERANCE_S = 30.0
# A worker's clock this far from worker 0's (median over the step ends) is reported.
CLOCK_OFFSET_NOTE_MS = 100.0
SPAN_COLUMNS = ["run", "worker", "workers", "cluster", "strategy", "start", "end", "source"]
MERGE_FIX = (
    "Merge them: kdt.Report.load(log_dir, merge_runs='detected') or keras-dp report "
    "LOG_DIR --merge-runs detected. Workers of this version agree on one run id when fit "
    "begins (the header's run_id_source says how); else set "
    f"{RUN_ID_ENV} to one value on every worker."
)


class MergeRunsError(ValueError):
    """``merge_runs`` names runs that cannot be merged as given (``load_job_frames``)."""


def load_job_frames(
    files: Iterable[tuple[str | os.PathLike, int]],
    merge_runs: str | Sequence[Sequence[str]] | None = None,
    detected_need_cluster: bool = False,
) -> dict:
    """``Report``'s constructor arguments for records files (each read from a byte
    offset), with runs merged as ``merge_runs`` says and ``jobs``: the findings about
    the log dir's jobs (``job_findings`` without the clocks, which need the workers).

    Args:
        files: ``(path, byte offset)`` pairs.
        merge_runs: None (merge nothing; runs that look split are reported),
            ``"detected"`` (merge the groups ``split_runs`` finds), or groups of run
            ids to merge, e.g. ``[["run-a", "run-b"]]``. A merged run keeps the id of
            its lowest worker's run.
        detected_need_cluster: with ``"detected"``, merge only groups whose headers
            share a cluster fingerprint; groups found by their ``workers`` count alone
            (older records) could be two jobs of one size at once, and stay apart.

    Raises:
        MergeRunsError: ``merge_runs`` is none of the above, names runs the records do
            not hold, a run twice, or runs that share a worker index.
    """
    records = report_frames.records_by_type(files)
    spans = run_spans(records)
    split = split_runs(spans)
    detected = split
    if detected_need_cluster:
        runs = _per_run(spans)
        detected = [group for group in split if runs[group[0]]["cluster"] is not None]
    groups = _groups_to_merge(merge_runs, detected, spans)
    if groups:
        records = merge_run_ids(records, groups)
        spans = run_spans(records)
        # Found again on the merged runs: a merge named by hand may differ from what
        # was found before it (part of a group, or runs found with others).
        split = split_runs(spans)
    frames = report_frames.report_frames_handed_over(records)
    return {**frames, "jobs": records_findings(spans, split, groups)}


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
                    f"{_workers_text(shared)}: one job has one worker of each index, so "
                    "they are different jobs (or a restart). Merge only runs with "
                    "disjoint workers (the split-runs finding names them), or load the "
                    "jobs apart."
                )
    return [sorted(group, key=lambda run: min(workers[run])) for group in groups]


def run_spans(records: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per run and worker with a header (``SPAN_COLUMNS``): its ``workers``
    count and ``cluster`` (the last header's), ``start`` (its first header's time) and
    ``end`` (its last record's time, a step's end), and the records file."""
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
    Grouped on integer codes: a million step records take milliseconds, not seconds."""

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


def _per_run(spans: pd.DataFrame) -> dict[str, dict]:
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
    (see the module docstring), each ordered by its lowest worker; runs that already
    hold all their workers are never grouped."""
    runs = _per_run(spans)
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
    """The records with every run of a group renamed to the group's first run (by
    ``load_job_frames``, the one of its lowest worker); headers keep the id they were
    recorded under in ``recorded_run``."""
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


def _workers_text(indexes) -> str:
    indexes = sorted(int(index) for index in indexes)
    if len(indexes) == 1:
        return f"worker {indexes[0]}"
    return "workers " + ", ".join(map(str, indexes[:-1])) + f" and {indexes[-1]}"


def _clock(seconds: float) -> str:
    return pd.Timestamp(seconds, unit="s").strftime("%H:%M:%S")


def _apart(seconds: float) -> str:
    seconds = abs(seconds)
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.1f} s"


def records_findings(
    spans: pd.DataFrame, split: list[list[str]], merged: Sequence[Sequence[str]] = ()
) -> list[Finding]:
    """What the records say about the log dir's jobs (after any merge): runs that look
    split (``split``: not merged), runs merged (``merged``: as first recorded), a run
    id two clusters share, and workers of a job that recorded nothing here."""
    runs = _per_run(spans)
    findings = [_split_finding(group, runs) for group in split]
    findings += [
        Advice(
            "info",
            f"Runs {', '.join(group)} were merged into run {group[0]} as one job's workers",
            f"{len(group)} runs of one job, merged on request before the cross-worker analysis.",
            "Nothing to do.",
            code="merged-runs",
        )
        for group in merged
    ]
    findings += _mixed_clusters(spans)
    findings += _missing_workers(runs, split)
    return findings


def _split_finding(group: list[str], runs: dict) -> Finding:
    parts = [f"{run} ({_workers_text(runs[run]['indexes'])})" for run in group]
    first = runs[group[0]]
    why = (
        f"the same cluster {first['cluster']}"
        if first["cluster"] is not None
        else f"headers that all say {int(first['workers'])} workers (recorded without a "
        "cluster fingerprint)"
    )
    spans = ", ".join(f"{_clock(runs[run]['start'])}-{_clock(runs[run]['end'])}" for run in group)
    evidence = (
        f"{why}, disjoint worker indexes, and overlapping times ({spans} UTC). As "
        "separate runs their workers are analysed alone: what one waited for another "
        "shows as all-reduce transfer, and no straggler can be named."
    )
    return Advice(
        "high",
        f"Runs {' and '.join(parts)} look like one job's workers recorded as separate "
        "runs (merge_runs='detected' or --merge-runs detected merges them)",
        evidence,
        MERGE_FIX,
        code="split-runs",
    )


def _mixed_clusters(spans: pd.DataFrame) -> list[Finding]:
    findings = []
    for run, group in spans.groupby("run", sort=False):
        clusters = group.dropna(subset=["cluster"]).groupby("cluster", sort=False)
        if clusters.ngroups < 2:
            continue
        parts = [
            f"{_workers_text(rows['worker'])} in cluster {cluster} "
            f"(from {_clock(rows['start'].min())})"
            for cluster, rows in clusters
        ]
        starts = [rows["start"].min() for _, rows in clusters]
        findings.append(
            Advice(
                "high",
                f"Run {run} mixes workers of {clusters.ngroups} different jobs: "
                + "; ".join(parts),
                f"one run id was recorded by workers of different clusters, started "
                f"{_apart(max(starts) - min(starts))} apart: its cross-worker numbers "
                "compare steps of different jobs.",
                f"Give every job its own {RUN_ID_ENV} (or leave it unset: the workers "
                "agree on one), or its own log dir; load each job's files alone meanwhile.",
                code="mixed-jobs",
            )
        )
    return findings


def _missing_workers(runs: dict, split: list[list[str]]) -> list[Finding]:
    """Jobs (a run, or a group of runs that look split) whose headers say more workers
    than recorded; where another run here holds the missing worker, that run is named
    as what it is (another job's), and gets no line of its own."""
    jobs = [list(group) for group in split]
    grouped = {run for group in split for run in group}
    jobs += [[run] for run in runs if run not in grouped]
    jobs.sort(key=lambda job: -max(runs[run]["start"] for run in job))  # latest first
    explained: set[str] = set()
    findings = []
    for job in jobs:
        if explained.intersection(job):
            continue
        first = runs[job[0]]
        workers = first["workers"]
        if pd.isna(workers) or workers < 2:
            continue
        recorded = frozenset().union(*(runs[run]["indexes"] for run in job))
        missing = sorted(set(range(int(workers))) - recorded)
        if not missing:
            continue
        start = min(runs[run]["start"] for run in job)
        others = []
        for run, info in runs.items():
            if run in job or not info["indexes"] & set(missing):
                continue
            explained.add(run)
            differs = (
                f"cluster {info['cluster']}, not {first['cluster']}; "
                if info["cluster"] != first["cluster"]
                else ""
            )
            when = "before" if info["start"] < start else "after"
            others.append(
                f"the {_workers_text(info['indexes'] & set(missing))} records here are run "
                f"{run}, another job ({differs}started {_apart(info['start'] - start)} {when})"
            )
        names = " and ".join(job)
        evidence = (
            f"its headers say {int(workers)} workers; the log dir holds "
            f"{_workers_text(recorded)} of it"
            + (f"; {'; '.join(others)}" if others else "")
            + ". The cross-worker view covers the workers that recorded."
        )
        findings.append(
            Advice(
                "medium",
                f"Run {names}: {_workers_text(missing)} of {int(workers)} recorded nothing here",
                evidence,
                "Check where that worker wrote its records (its log_dir), and that it "
                "trained with kdt.callbacks; records of another job belong in a log dir "
                "of their own.",
                code="missing-worker",
            )
        )
    return findings


def clock_findings(workers: pd.DataFrame) -> list[Finding]:
    """Workers whose clock is ``CLOCK_OFFSET_NOTE_MS`` or more from worker 0's, as the
    step ends measure it (``Report.workers``): the cross-worker view aligns them. More
    than ``worker_digest.LISTED_UP_TO`` workers of a run: one finding for them all."""
    findings = []
    if workers.empty or "clock_offset_ms" not in workers:
        return findings
    timed = workers.dropna(subset=["clock_offset_ms"]).drop_duplicates(["run", "worker"])
    far = timed[timed["clock_offset_ms"].abs() >= CLOCK_OFFSET_NOTE_MS]
    fix = "Synchronise the hosts' clocks (NTP, chrony) to compare raw times."
    for run, group in far.groupby("run", sort=False):
        if len(group) > LISTED_UP_TO:
            apart = group["clock_offset_ms"].abs() / 1e3
            findings.append(
                Advice(
                    "info",
                    f"Run {run}: {len(group)} workers' clocks are {apart.min():.2f} to "
                    f"{apart.max():.2f} s from worker 0's",
                    f"{worker_names(group['worker'])}: the median difference of their step "
                    "ends from worker 0's; the cross-worker view aligns the clocks at the "
                    f"step ends (residual up to {group['clock_residual_ms'].max():.2f} ms), "
                    "so waits stay true, but the records' raw times disagree by that much.",
                    fix,
                    code="clock-offset",
                )
            )
            continue
        for row in group.itertuples():
            ahead = "ahead of" if row.clock_offset_ms > 0 else "behind"
            findings.append(
                Advice(
                    "info",
                    f"Run {row.run}: worker {row.worker}'s clock is "
                    f"{abs(row.clock_offset_ms) / 1e3:.2f} s {ahead} worker 0's",
                    f"the median difference of their step ends; the cross-worker view aligns "
                    f"the clocks at the step ends (residual {row.clock_residual_ms:.2f} ms), "
                    "so waits stay true, but the records' raw times disagree by that much.",
                    fix,
                    code="clock-offset",
                )
            )
    return findings


def job_findings(report) -> list[Finding]:
    """The findings about the report's jobs: those of its records (``report.jobs``) and
    the clocks (``clock_findings`` of ``report.workers``)."""
    return [*getattr(report, "jobs", []), *clock_findings(report.workers)]


def advice_with_jobs(report) -> list[Finding]:
    """``Report.advice()``: the advisor's findings (``summary.run_advice``) and the
    jobs' (``job_findings``), worst first."""
    advice = run_advice(report) + job_findings(report)
    return sorted(advice, key=lambda item: -item.severity.level)
