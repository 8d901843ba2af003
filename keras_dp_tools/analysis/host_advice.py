"""The advisor's findings from the host and the run as a whole: GPUs idle, the CPU
saturated, the batching check's findings, step times that vary a lot, and scaling
across runs of different replica counts. Thresholds are module constants, so a
finding says which line it crossed.

Pure functions over a run's frames (``analysis.run_frames.RunFrames``); no TensorFlow.
"""

from __future__ import annotations

import pandas as pd

from keras_dp_tools.analysis.breakdown_advice import COMM_SHARE_HIGH, WAIT_SHARE_HIGH
from keras_dp_tools.analysis.utilization import misleading_utilization
from keras_dp_tools.common.findings import Advice, Finding
from keras_dp_tools.common.severity import Severity

GPU_UTIL_LOW = 50.0  # percent
SCALING_EFFICIENCY_LOW = 0.7
JITTER_RATIO = 1.5  # p90 over median step time
CPU_SATURATED = 75.0  # percent of all cores busy


def _all_steps(frames) -> pd.DataFrame:
    """Every step, with the columns of its own at least."""
    return frames.step_parts.all


def gpu_findings(frames) -> list[Finding]:
    """GPUs idle (mean utilization under ``GPU_UTIL_LOW``) and utilization that may
    mislead (``utilization.misleading_utilization``).

    Args:
        frames: the run's ``RunFrames``.

    Returns:
        The findings (empty without GPU readings).
    """
    advice = []
    steps = _all_steps(frames)
    utilization = steps["gpu_util_mean"].mean() if "gpu_util_mean" in steps else None
    if utilization is not None and pd.notna(utilization) and utilization < GPU_UTIL_LOW:
        advice.append(
            Advice(
                "warning",
                "GPUs are idle much of the time",
                f"mean GPU utilization over the steps is {utilization:.0f}% (NVML: share of "
                "time any kernel ran).",
                "Feed more work per step (larger per-replica batch), fix input or "
                "communication waits above, and keep Python out of the step "
                "(steps_per_execution > 1 in tf_keras, tf.function).",
                code="gpu-idle",
            )
        )

    return advice + misleading_utilization(frames.gpu)


def cpu_findings(frames) -> list[Finding]:
    """CPU-only runs: replicas on logical CPU devices share the cores."""
    if frames.gpu.shape[0] or frames.cpu.empty:
        return []
    cores = int(frames.cpu["cpu_count"].max())
    ours = frames.cpu["process_cpu_percent"].median() / cores
    busy = max(frames.cpu["system_cpu_percent"].median(), ours)
    if not busy >= CPU_SATURATED:
        return []
    return [
        Advice(
            "info",
            "The CPU is saturated: replicas compete for cores",
            f"all {cores} cores were {busy:.0f}% busy (median) while the replicas ran on "
            "CPU devices; waits and 'other' time then measure contention for cores, not "
            "an interconnect.",
            "Read these numbers as a rehearsal; measure communication on GPUs, or give "
            "each CPU replica its own cores.",
            code="cpu-saturated",
        )
    ]


# Findings of the run-time check that are not about the batch: titled as what they are.
_CHECK_TITLES = {
    "no-data-parallelism": "No data parallelism: fit trains one replica",
}


def batching_findings(frames) -> list[Finding]:
    """The batching check's recorded findings (``batching_finding`` records), once each."""
    findings = frames.batching.drop_duplicates(["code", "message"])
    known = {str(level) for level in Severity}
    return [
        Advice(
            row.severity if row.severity in known else "info",
            _CHECK_TITLES.get(row.code, f"Batching: {row.code}"),
            row.message,
            row.fix,
            code=row.code,
        )
        for row in findings.itertuples()
    ]


def step_time_findings(frames) -> list[Finding]:
    # A multi-worker run's steps at the job's pace: its workers' own times inside the
    # train call differ (short on the worker the others wait for), a mix that varies.
    """Step times that vary a lot: p90 over ``JITTER_RATIO`` times the median of the
    measured step times (``measured_steps.measured_step_times``).

    Args:
        frames: the run's ``RunFrames``.

    Returns:
        The finding, or empty.
    """
    steps = _all_steps(frames)
    times = frames.step_parts.measured()["step_ms"]
    if len(times) < 10:
        return []
    median, p90 = times.median(), times.quantile(0.9)
    if not p90 > JITTER_RATIO * median:
        return []
    whose = "job " if steps["worker"].nunique() > 1 else ""
    return [
        Advice(
            "info",
            "Step times vary a lot",
            f"p90 {whose}step time {p90:.1f} ms is {p90 / median:.1f}x the median {median:.1f} ms.",
            "Look for periodic host work (checkpoints, logging, evaluation), input "
            "stalls, or other processes sharing the machine (Report.cpu).",
            code="step-jitter",
        )
    ]


def scaling_findings(frames, table: pd.DataFrame | None) -> list[Finding]:
    """Poor scaling, with only the causes the runs show: communication or waiting over
    their thresholds, a shrinking per-replica batch, replicas sharing CPU cores.
    ``table``: the runs by replica count (``Report.compare()``)."""
    if table is None or table["replicas"].nunique() < 2:
        return []
    base, worst = table.iloc[0], table.iloc[-1]
    if not worst["scaling_efficiency"] < SCALING_EFFICIENCY_LOW:
        return []
    replicas = int(worst["replicas"])
    evidence = (
        f"at {replicas} replicas throughput is {worst['speedup']:.2f}x that of "
        f"{int(base['replicas'])} (efficiency {worst['scaling_efficiency']:.0%})"
    )
    # comm_share: exposed transfer only (docs/breakdown.md); waiting is wait_share.
    comm_share, wait_share = worst["comm_share"], worst["wait_share"]
    if pd.notna(comm_share):
        evidence += f"; comm share there {comm_share:.0%}, wait share {wait_share:.0%}"
    causes = []
    cores = _shared_cpu_cores(frames, worst["run"])
    if cores is not None:
        evidence += f"; its {replicas} replicas are logical devices of one CPU" + (
            f" with {cores} cores" if cores else ""
        )
        causes.append(
            "The replicas share the same CPU cores: more replicas add no compute, so "
            "throughput cannot grow with them. Measure scaling on GPUs (one per replica)."
        )
    if comm_share >= COMM_SHARE_HIGH:
        causes.append("Communication is a large share of the step: see the communication advice.")
    if wait_share >= WAIT_SHARE_HIGH:
        causes.append("Replicas wait for each other: see the waiting advice.")
    per_replica = table["global_batch"] / table["replicas"]
    if per_replica.iloc[-1] < per_replica.iloc[0]:
        causes.append(
            f"The per-replica batch fell from {per_replica.iloc[0]:g} to "
            f"{per_replica.iloc[-1]:g}: keep it constant as you add replicas (weak scaling)."
        )
    # On shared cores alone, poor scaling is expected: a note, not an alarm.
    severity = "info" if cores is not None and len(causes) == 1 else "warning"
    if pd.isna(comm_share):
        causes.append(
            "Profile the largest run (kdt.DataParallelProfiler) to see where its time goes."
        )
    elif not causes:
        causes.append(
            "Communication and waiting are low there: compare compute_ms, input_ms and "
            "other_ms of the runs (Report.summary) to see which part grew."
        )
    fix = " ".join(causes)
    return [Advice(severity, "Scaling is poor", evidence + ".", fix, code="poor-scaling")]


def _shared_cpu_cores(frames, run) -> int | None:
    """The run's core count (0 if unrecorded) when its replicas are logical devices
    of one host's CPU; None when they are not (or the devices are unknown)."""
    runs = frames.runs[frames.runs["run"] == run]
    devices = [
        str(device)
        for listed in runs["devices"]
        if pd.api.types.is_list_like(listed)
        for device in listed
    ]
    if not devices or not all("CPU" in device.upper() for device in devices):
        return None
    if frames.gpu["run"].eq(run).any():
        return None
    counts = frames.cpu.loc[frames.cpu["run"] == run, "cpu_count"].dropna()
    return int(counts.max()) if len(counts) else 0
