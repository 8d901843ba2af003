"""Findings about a log dir's jobs: runs that look split (and how to merge them), runs
merged, workers missing or from another job, a run id two clusters share, and clocks
far apart. The facts come from ``analysis.jobs.merge_jobs`` (``RunFrames.jobs``) and
the worker view (``RunFrames.workers``); ``job_findings`` gives them all, as
``Report.job_findings()`` does.

Pure functions; no TensorFlow.
"""

from __future__ import annotations

import pandas as pd

from keras_dp_tools.analysis.jobs import JobMerge, runs_of_spans, workers_text
from keras_dp_tools.analysis.worker_digest import LISTED_UP_TO, worker_names
from keras_dp_tools.common.findings import Advice, Finding
from keras_dp_tools.records.contract import RUN_ID_ENV

# A worker's clock this far from worker 0's (median over the step ends) is reported.
CLOCK_OFFSET_NOTE_MS = 100.0
MERGE_FIX = (
    "Merge them: kdt.Report.load(log_dir, merge_runs='detected') or keras-dp report "
    "LOG_DIR --merge-runs detected. Workers of this version agree on one run id when fit "
    "begins (the header's run_id_source says how); else set "
    f"{RUN_ID_ENV} to one value on every worker."
)


def job_findings(frames) -> list[Finding]:
    """The findings about the jobs of a run's frames: those of its records
    (``records_findings`` of ``frames.jobs``) and the workers' clocks
    (``clock_findings`` of ``frames.workers``).

    Args:
        frames: a ``RunFrames`` (``analysis.run_frames``).

    Returns:
        The findings, records' first (``Report.job_findings()``).

    Example:

    ```python
    from keras_dp_tools.analysis.job_advice import job_findings
    from keras_dp_tools.analysis.run_frames import load_run_frames

    for finding in job_findings(load_run_frames([("runs/job/keras_dp/worker-0.jsonl", 0)])):
        print(finding)
    ```
    """
    return [*records_findings(frames.jobs), *clock_findings(frames.workers)]


def _clock(seconds: float) -> str:
    return pd.Timestamp(seconds, unit="s").strftime("%H:%M:%S")


def _apart(seconds: float) -> str:
    seconds = abs(seconds)
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.1f} s"


def records_findings(merge: JobMerge) -> list[Finding]:
    """What the records say about the log dir's jobs (after any merge): runs that look
    split (``merge.split``: not merged), runs merged (``merge.merged``: as first
    recorded), a run id two clusters share, and workers of a job that recorded nothing
    here.

    Args:
        merge: what ``analysis.jobs.merge_jobs`` found and did.

    Returns:
        The findings (codes ``split-runs``, ``merged-runs``, ``mixed-jobs``,
        ``missing-worker``), in that order.
    """
    spans, split, merged = merge.spans, merge.split, merge.merged
    runs = runs_of_spans(spans)
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
    parts = [f"{run} ({workers_text(runs[run]['indexes'])})" for run in group]
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
        "error",
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
            f"{workers_text(rows['worker'])} in cluster {cluster} "
            f"(from {_clock(rows['start'].min())})"
            for cluster, rows in clusters
        ]
        starts = [rows["start"].min() for _, rows in clusters]
        findings.append(
            Advice(
                "error",
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
                f"the {workers_text(info['indexes'] & set(missing))} records here are run "
                f"{run}, another job ({differs}started {_apart(info['start'] - start)} {when})"
            )
        names = " and ".join(job)
        evidence = (
            f"its headers say {int(workers)} workers; the log dir holds "
            f"{workers_text(recorded)} of it"
            + (f"; {'; '.join(others)}" if others else "")
            + ". The cross-worker view covers the workers that recorded."
        )
        findings.append(
            Advice(
                "warning",
                f"Run {names}: {workers_text(missing)} of {int(workers)} recorded nothing here",
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
    step ends measure it: the cross-worker view aligns them.

    Args:
        workers: the worker view (``Report.workers``).

    Returns:
        ``clock-offset`` findings (``info``): one per worker, or one for a run's workers
        where more than ``worker_digest.LISTED_UP_TO`` are that far.
    """
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
