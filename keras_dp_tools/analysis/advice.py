"""The advisor: findings about a run, each with its evidence and a concrete fix.

Pure functions over a ``Report`` (its frames): thresholds are module constants so a
finding says which line it crossed.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

COMM_SHARE_HIGH = 0.20  # exposed all-reduce transfer over step time
WAIT_SHARE_HIGH = 0.15  # exposed waiting for the slowest replica over step time
INPUT_SHARE_HIGH = 0.10  # exposed input wait over step time
STRAGGLER_SHARE = 0.6  # one replica last to arrive in this share of profiled steps
WORKER_WAIT_SHARE = 0.10  # other workers' median wait for the last worker over step time
WORKER_MIN_STEPS = 10  # timed steps every worker recorded, before naming a slow worker
GPU_UTIL_LOW = 50.0  # percent
SCALING_EFFICIENCY_LOW = 0.7
JITTER_RATIO = 1.5  # p90 over median step time
CPU_SATURATED = 75.0  # percent of all cores busy
_SEVERITY_ORDER = {"high": 0, "medium": 1, "info": 2}


@dataclass(frozen=True)
class Advice:
    """``severity``: high, medium or info; ``evidence``: the numbers behind it."""

    severity: str
    title: str
    evidence: str
    fix: str

    def __str__(self) -> str:
        return f"[{self.severity}] {self.title}\n  evidence: {self.evidence}\n  fix: {self.fix}"

    def to_markdown(self) -> str:
        return f"- **{self.severity}: {self.title}**. {self.evidence} *Fix:* {self.fix}"


def _profiled(report) -> pd.DataFrame:
    steps = report.steps
    return steps[steps["trace_step_ms"].notna()] if "trace_step_ms" in steps else steps.iloc[:0]


def _communication(profiled: pd.DataFrame, report) -> list[Advice]:
    share = profiled["comm_share"].median()
    if not share >= COMM_SHARE_HIGH:
        return []
    busbw = profiled["busbw_gbps"].median()
    megabytes = profiled["allreduce_bytes"].max() / 1e6
    embeddings = report.runs.get("embedding_layers", pd.Series(dtype=float)).fillna(0).max()
    evidence = (
        f"exposed all-reduce transfer is {share:.0%} of the step (median of "
        f"{len(profiled)} profiled steps); {megabytes:.1f} MB of gradients per step"
        + (f" at a bus bandwidth of {busbw:.2f} GB/s." if pd.notna(busbw) else ".")
    )
    fix = (
        "Raise the per-replica batch (fewer all-reduces per example); train in mixed "
        "precision (keras.mixed_precision.set_global_policy('mixed_float16')) and reduce "
        "gradients in fp16 where accuracy allows; pack gradients into fewer all-reduces "
        "(tf.distribute.MirroredStrategy(cross_device_ops=tf.distribute.NcclAllReduce("
        "num_packs=2))); without NVLink, try tf.distribute.HierarchicalCopyAllReduce()."
    )
    advice = [
        Advice(
            "high", "Communication-bound: gradients take a large share of each step", evidence, fix
        )
    ]
    if embeddings and embeddings > 0:
        advice.append(
            Advice(
                "medium",
                "Embedding gradients may fall back to a slow reduction",
                f"the model has {int(embeddings)} embedding layer(s); their gradients are "
                "IndexedSlices, which TensorFlow reduces to one device ('Efficient allreduce "
                "is not supported for n IndexedSlices'), so GPUs take turns.",
                "Densify those gradients in a custom train_step (tf.convert_to_tensor) when "
                "the tables are small, or keep large tables off the all-reduce.",
            )
        )
    return advice


def _waiting(profiled: pd.DataFrame, report) -> list[Advice]:
    advice = []
    share = profiled["wait_share"].median()
    if share >= WAIT_SHARE_HIGH:
        advice.append(
            Advice(
                "high",
                "Replicas wait for each other at the all-reduce",
                f"exposed sync wait is {share:.0%} of the step (median); the slowest "
                f"replica kept the others waiting {profiled['max_sync_wait_ms'].median():.2f} "
                "ms per step.",
                "Balance the work per replica: the same per-replica batch and sequence "
                "lengths, input prepared ahead (prefetch), no other jobs on the devices; "
                "see the straggler view (keras_dp_tools.plots.sync_wait).",
            )
        )
    stragglers = profiled["straggler_replica"].dropna()
    if len(stragglers) >= 3:
        counts = stragglers.value_counts()
        replica, times = int(counts.index[0]), int(counts.iloc[0])
        if times / len(stragglers) >= STRAGGLER_SHARE and report.runs["replicas"].max() > 2:
            advice.append(
                Advice(
                    "medium",
                    f"Replica {replica} is a straggler",
                    f"it arrived last at the all-reduce in {times} of {len(stragglers)} "
                    "profiled steps.",
                    f"Check the device of replica {replica}: clocks and temperature "
                    "(Report.gpu), another process on it, or a slower link.",
                )
            )
    return advice


def _input(profiled: pd.DataFrame) -> list[Advice]:
    share = (profiled["input_ms"] / profiled["trace_step_ms"]).median()
    if not share >= INPUT_SHARE_HIGH:
        return []
    return [
        Advice(
            "high",
            "Input-bound: steps wait for data",
            f"exposed input wait is {share:.0%} of the step (median of profiled steps).",
            "dataset.prefetch(tf.data.AUTOTUNE) last; map(..., num_parallel_calls="
            "tf.data.AUTOTUNE); cache() after expensive, deterministic steps; interleave "
            "file reads; decode and augment on fewer, larger batches.",
        )
    ]


def _gpu(report) -> list[Advice]:
    advice = []
    utilization = report.steps["gpu_util_mean"].mean() if "gpu_util_mean" in report.steps else None
    if utilization is not None and pd.notna(utilization) and utilization < GPU_UTIL_LOW:
        advice.append(
            Advice(
                "medium",
                "GPUs are idle much of the time",
                f"mean GPU utilization over the steps is {utilization:.0f}% (NVML: share of "
                "time any kernel ran).",
                "Feed more work per step (larger per-replica batch), fix input or "
                "communication waits above, and keep Python out of the step "
                "(steps_per_execution > 1 in tf_keras, tf.function).",
            )
        )
    from keras_dp_tools.analysis.utilization import utilization_findings

    for note in utilization_findings(report.gpu):
        advice.append(
            Advice(
                "info",
                "GPU utilization is possibly misleading",
                note,
                "Judge by SM activity (GPM) and step time rather than NVML utilization.",
            )
        )
    return advice


def _cpu(report) -> list[Advice]:
    """CPU-only runs: replicas on logical CPU devices share the cores."""
    if report.gpu.shape[0] or report.cpu.empty:
        return []
    cores = int(report.cpu["cpu_count"].max())
    ours = report.cpu["process_cpu_percent"].median() / cores
    busy = max(report.cpu["system_cpu_percent"].median(), ours)
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
        )
    ]


def _batching(report) -> list[Advice]:
    severity = {"error": "high", "warning": "medium", "info": "info"}
    findings = report.batching.drop_duplicates(["code", "message"])
    return [
        Advice(severity.get(row.severity, "info"), f"Batching: {row.code}", row.message, row.fix)
        for row in findings.itertuples()
    ]


def _steps(report) -> list[Advice]:
    steps = report.steps
    steps = steps[~steps["warmup"].fillna(False).astype(bool) & ~steps["profiled"].astype(bool)]
    if len(steps) < 10:
        return []
    median, p90 = steps["step_ms"].median(), steps["step_ms"].quantile(0.9)
    if not p90 > JITTER_RATIO * median:
        return []
    return [
        Advice(
            "info",
            "Step times vary a lot",
            f"p90 step time {p90:.1f} ms is {p90 / median:.1f}x the median {median:.1f} ms.",
            "Look for periodic host work (checkpoints, logging, evaluation), input "
            "stalls, or other processes sharing the machine (Report.cpu).",
        )
    ]


def _scaling(report) -> list[Advice]:
    if report.steps["replicas"].nunique() < 2:
        return []
    table = report.compare()
    worst = table.iloc[-1]
    if not worst["scaling_efficiency"] < SCALING_EFFICIENCY_LOW:
        return []
    evidence = (
        f"at {int(worst['replicas'])} replicas throughput is {worst['speedup']:.2f}x that of "
        f"{int(table['replicas'].iloc[0])} (efficiency {worst['scaling_efficiency']:.0%})"
    )
    if pd.notna(worst["comm_share"]):
        evidence += f"; comm share there {worst['comm_share']:.0%}"
    return [
        Advice(
            "high",
            "Scaling is poor",
            evidence + ".",
            "Profile the largest run (kdt.DataParallelProfiler) and follow the "
            "communication and waiting advice; keep the per-replica batch constant as you "
            "add replicas (weak scaling).",
        )
    ]


def _workers(report) -> list[Advice]:
    """Multi-worker runs: the worker the others wait for (``analysis.workers``)."""
    from keras_dp_tools.analysis.workers import straggler

    if "median_worker_wait_ms" not in report.workers:
        return []
    found = straggler(report.workers, report.steps)
    if found is None:
        return []
    steps = report.steps[~report.steps["warmup"].astype("boolean").fillna(False)]
    share = found["others_wait_ms"] / steps["step_ms"].median()
    timed = steps.dropna(subset=["worker_wait_ms"])["step"].nunique()
    # The wait must stand out of the clocks' disagreement, over enough steps.
    clear = found["others_wait_ms"] > 3 * found["clock_residual_ms"]
    if not (share >= WORKER_WAIT_SHARE and clear and timed >= WORKER_MIN_STEPS):
        return []
    if found["last_share"] < STRAGGLER_SHARE:
        return []
    fixes = {
        "host": "Move the extra work out of that worker's step loop (callbacks, logging, "
        "Python-side preprocessing), or find what else runs on its machine.",
        "input": "Speed up that worker's input pipeline: prefetch(tf.data.AUTOTUNE), "
        "parallel map, data local to the machine.",
        "compute": "Check that worker's devices: clocks and temperature, other processes, "
        "a slower GPU model than its peers.",
        "unknown": "The slowness is inside its train call (input or compute): profile that "
        "worker too (DataParallelProfiler(all_workers=True)).",
    }
    worker = found["worker"]
    evidence = (
        f"worker {worker} entered the step last in {found['last_share']:.0%} of the steps; "
        f"the other workers waited a median {found['others_wait_ms']:.1f} ms per step for it "
        f"({share:.0%} of the step); clocks aligned at the step ends within "
        f"{found['clock_residual_ms']:.2f} ms"
        + (f"; {found['detail']}" if found["detail"] else "")
        + "."
    )
    return [Advice("high", f"Worker {worker} is a straggler", evidence, fixes[found["why"]])]


def _run_advice(report) -> list[Advice]:
    profiled = _profiled(report)
    advice = []
    if not profiled.empty:
        advice += _communication(profiled, report) + _waiting(profiled, report) + _input(profiled)
    advice += _workers(report)
    return advice + _gpu(report) + _cpu(report) + _batching(report) + _steps(report)


def advise(report) -> list[Advice]:
    """All findings for the runs in ``report``, worst first. With several runs, each
    run's findings say which run they are about, and the runs are compared."""
    runs = list(report.runs["run"].drop_duplicates())
    if len(runs) <= 1:
        advice = _run_advice(report)
    else:
        advice = []
        for run in runs:
            part = report.for_run(run)
            replicas = part.runs["replicas"].max()
            where = f"run {run} ({replicas} replicas): "
            advice += [
                Advice(item.severity, item.title, where + item.evidence, item.fix)
                for item in _run_advice(part)
            ]
    advice += _scaling(report)
    return sorted(advice, key=lambda item: _SEVERITY_ORDER.get(item.severity, 3))


def advice_markdown(advice: list[Advice]) -> str:
    """The findings as a markdown list (TensorBoard's Text tab, HTML reports)."""
    if not advice:
        return "No findings: nothing stands out in the recorded numbers."
    return "\n".join(item.to_markdown() for item in advice)
