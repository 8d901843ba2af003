"""The advisor: findings about a run, each with its evidence and a concrete fix.

Pure functions over a run's frames (``analysis.run_frames.RunFrames``; ``Report`` passes
its scaling table): thresholds are module constants so a finding says which line
it crossed. Nothing here calls back into ``Report``. Each finding is a
``keras_dp_tools.common.findings.Finding`` (made with ``Advice``: severity, title,
evidence, fix) with a ``code`` of its own.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pandas as pd

from keras_dp_tools.analysis.breakdown.bandwidth import NO_BYTES, NO_REDUCE
from keras_dp_tools.analysis.worker_advice import late_worker_findings
from keras_dp_tools.common.findings import Advice, Finding
from keras_dp_tools.common.known_bugs import ALLREDUCE_BUG, ALLREDUCE_FIX, drops_gradient_allreduce
from keras_dp_tools.common.severity import Severity

COMM_SHARE_HIGH = 0.20  # exposed all-reduce transfer over step time
WAIT_SHARE_HIGH = 0.15  # exposed waiting for the slowest replica over step time
INPUT_SHARE_HIGH = 0.10  # exposed input wait over step time
STRAGGLER_SHARE = 0.6  # one replica last to arrive in this share of profiled steps
GPU_UTIL_LOW = 50.0  # percent
SCALING_EFFICIENCY_LOW = 0.7
JITTER_RATIO = 1.5  # p90 over median step time
CPU_SATURATED = 75.0  # percent of all cores busy
GATHER_SHARE_HIGH = 0.10  # all-gather of sparse gradients over step time: medium, else info
OTHER_SHARE_HIGH = 0.40  # time outside compute, communication and input over step time
_TABLE_SIZE = re.compile(r"\((\d+)x(\d+)\)")


def _all_steps(frames) -> pd.DataFrame:
    """Every step, with the columns of its own at least."""
    return frames.step_parts.all


def _profiled(frames) -> pd.DataFrame:
    steps = frames.step_parts.profiled
    return steps[steps["trace_step_ms"].notna()] if "trace_step_ms" in steps else steps.iloc[:0]


def _communication(profiled: pd.DataFrame, frames) -> list[Finding]:
    share = profiled["comm_share"].median()
    if not share >= COMM_SHARE_HIGH:
        return []
    busbw = profiled["busbw_gbps"].median()
    megabytes = profiled["allreduce_bytes"].max() / 1e6
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
            "high",
            "Communication-bound: gradients take a large share of each step",
            evidence,
            fix,
            code="communication-bound",
        )
    ]
    return advice


def _unsynchronised(profiled: pd.DataFrame, frames) -> list[Finding]:
    """A Keras known not to all-reduce gradients under a mirrored strategy, and what the
    trace shows of it: no gradient collective in any profiled step."""
    run = frames.runs.iloc[0] if len(frames.runs) else None
    if run is None or not drops_gradient_allreduce(
        run.get("keras_package"), run.get("keras_version")
    ):
        return []
    strategy, replicas = str(run.get("strategy")), run.get("replicas")
    if "Mirrored" not in strategy or not replicas > 1:
        return []
    notes = profiled["bandwidth_note"] if "bandwidth_note" in profiled else pd.Series(dtype=object)
    if len(notes) and (notes == NO_REDUCE).all():
        seen = f"; the trace agrees: none of the {len(notes)} profiled steps ran an all-reduce."
    elif not notes.isin([NO_REDUCE, NO_BYTES]).all():
        return []  # an all-reduce ran (its bandwidth was measured): no bug on this run
    else:  # no profiled step, or bytes unknown: the trace cannot tell
        seen = (
            " (the trace of this run cannot confirm it: no all-reduce bytes or no profiled step)."
        )
    bug = ALLREDUCE_BUG.format(
        version=run["keras_version"], strategy=strategy, replicas=int(replicas)
    )
    return [
        Advice(
            "high",
            "Replicas train apart: no gradient all-reduce",
            bug + seen,
            ALLREDUCE_FIX,
            code="replicas-not-synchronised",
        )
    ]


def _embedding_names(frames) -> list[str]:
    names = frames.runs.get("embedding_names")
    if names is None:
        return []
    found = []
    for value in names.dropna():
        found += [name for name in list(value) if name not in found]
    return found


def _embeddings(profiled: pd.DataFrame, frames) -> list[Finding]:
    """Sparse gradients seen in the trace: TF 2.21 all-gathers them (values and
    indices) rather than all-reducing the table."""
    if "gather_ms" not in profiled or not (profiled["gather_ms"] > 0).any():
        return []
    gathered = profiled[profiled["gather_ms"] > 0]
    gather_ms = gathered["gather_ms"].median()
    share = (gathered["gather_ms"] / gathered["trace_step_ms"]).median()
    names = _embedding_names(frames)
    layers = ", ".join(names) if names else "the model's embedding layer(s)"
    table_bytes = sum(4 * int(v) * int(d) for n in names for v, d in _TABLE_SIZE.findall(n))
    evidence = (
        f"the gradients of {layers} are IndexedSlices, which TensorFlow all-gathers "
        f"(CollectiveGatherV2 of the looked-up rows and their indices) instead of "
        f"all-reducing the table: {gather_ms:.2f} ms per step in gathers, {share:.0%} "
        f"of the step (median of {len(gathered)} profiled steps)"
    )
    gather_bytes = gathered["gather_bytes"].median() if "gather_bytes" in gathered else None
    if pd.notna(gather_bytes):
        evidence += f"; {gather_bytes / 1e6:.2f} MB gathered per step"
        if table_bytes:
            evidence += f" against {table_bytes / 1e6:.1f} MB for the table(s) as dense gradients"
    busbw = gathered["gather_busbw_gbps"].median() if "gather_busbw_gbps" in gathered else None
    evidence += f", all-gather bus bandwidth {busbw:.2f} GB/s." if pd.notna(busbw) else "."
    fix = (
        "The gather moves every looked-up row (batch x sequence x dim), however small "
        "the vocabulary. For a small vocabulary, densify the gradient "
        "(tf.convert_to_tensor on it in a custom train_step) so it joins the packed "
        "all-reduce: worth it while the table is smaller than the rows gathered per "
        "step. Otherwise use a smaller vocabulary (hashing, a frequency cut-off) or "
        "embedding dim, or shard the table (ParameterServerStrategy with sharded "
        "variables, TPUEmbedding). On GPUs with NCCL, TensorFlow may instead log "
        "'Efficient allreduce is not supported for n IndexedSlices' and reduce them on "
        "one device, so the GPUs take turns."
    )
    severity = "medium" if share >= GATHER_SHARE_HIGH else "info"
    title = f"Embedding gradients are all-gathered ({layers})"
    return [Advice(severity, title, evidence, fix, code="embedding-gather")]


def _other(profiled: pd.DataFrame) -> list[Finding]:
    """Time in no named part of the step, split into what can be named."""
    share = (profiled["other_ms"] / profiled["trace_step_ms"]).median()
    if not share >= OTHER_SHARE_HIGH:
        return []
    parts = {
        "dispatch_ms": (
            "host time outside the train function (Python, callbacks, the call's dispatch)",
            "run several steps per call (compile(steps_per_execution=k)), keep per-batch "
            "callbacks light, or use larger batches so each call does more work",
        ),
        "idle_ms": (
            "time inside the train function when no replica ran any op (executor "
            "hand-offs, host threads)",
            "open the capture in the Profile tab's trace viewer and look at the gaps; "
            "on CPU devices, tune tf.config.threading.set_inter_op_parallelism_threads",
        ),
        "scheduling_ms": (
            "time a replica ran nothing while others ran (on CPU logical devices the "
            "replicas compete for the same cores; on GPUs, launch delays)",
            "on CPU devices give each replica its own cores or fewer replicas; on GPUs "
            "look for kernel launch gaps on that device in the trace viewer",
        ),
    }
    medians = {name: profiled[name].median() for name in parts if name in profiled}
    medians = {name: value for name, value in medians.items() if pd.notna(value)}
    evidence = f"{share:.0%} of the step is in no named part (median of profiled steps)"
    fix = "See keras-dp docs breakdown (other_ms) for what it holds."
    if medians:
        largest = max(medians, key=medians.get)
        described, fix = parts[largest]
        split = ", ".join(f"{name[:-3]} {value:.2f} ms" for name, value in medians.items())
        evidence += f"; most of it is {described} ({split} per step)"
    return [Advice("medium", "Most of the step is outside compute and communication",
                   evidence + ".", fix[0].upper() + fix[1:] + ".", code="other-time")]  # fmt: skip


def _waiting(profiled: pd.DataFrame, frames) -> list[Finding]:
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
                "see the straggler view (keras_dp_tools.report.plots.sync_wait).",
                code="replica-wait",
            )
        )
    stragglers = profiled["straggler_replica"].dropna()
    if len(stragglers) >= 3:
        counts = stragglers.value_counts()
        replica, times = int(counts.index[0]), int(counts.iloc[0])
        if times / len(stragglers) >= STRAGGLER_SHARE and frames.runs["replicas"].max() > 2:
            advice.append(
                Advice(
                    "medium",
                    f"Replica {replica} is a straggler",
                    f"it arrived last at the all-reduce in {times} of {len(stragglers)} "
                    "profiled steps.",
                    f"Check the device of replica {replica}: clocks and temperature "
                    "(Report.gpu), another process on it, or a slower link.",
                    code="replica-straggler",
                )
            )
    return advice


def _input(profiled: pd.DataFrame) -> list[Finding]:
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
            code="input-bound",
        )
    ]


def _gpu(frames) -> list[Finding]:
    advice = []
    steps = _all_steps(frames)
    utilization = steps["gpu_util_mean"].mean() if "gpu_util_mean" in steps else None
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
                code="gpu-idle",
            )
        )
    from keras_dp_tools.analysis.utilization import misleading_utilization

    return advice + misleading_utilization(frames.gpu)


def _cpu(frames) -> list[Finding]:
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


def _batching(frames) -> list[Finding]:
    """The batching check's recorded findings (``batching_finding`` records), once each."""
    findings = frames.batching.drop_duplicates(["code", "message"])
    known = {str(level) for level in Severity}
    return [
        Advice(
            row.severity if row.severity in known else "info",
            f"Batching: {row.code}",
            row.message,
            row.fix,
            code=row.code,
        )
        for row in findings.itertuples()
    ]


def _steps(frames) -> list[Finding]:
    # A multi-worker run's steps at the job's pace: its workers' own times inside the
    # train call differ (short on the worker the others wait for), a mix that varies.
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


def _scaling(frames, table: pd.DataFrame | None) -> list[Finding]:
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
    severity = "info" if cores is not None and len(causes) == 1 else "high"
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


# What replicas that share saturated CPU cores show as waits and gaps: contention for
# the cores, graded as what it is rather than as a problem of balance or of the host.
_CONTENTION_CODES = ("replica-wait", "replica-straggler", "other-time")


def _as_contention(finding: Finding) -> Finding:
    return replace(
        finding,
        severity=Severity.INFO,
        evidence=f"{finding.evidence} The CPU is saturated on this run, so this measures "
        "replicas competing for the same cores (see the CPU finding), not imbalance.",
    )


def _run_advice(frames) -> list[Finding]:
    profiled = _profiled(frames)
    advice = _unsynchronised(profiled, frames)
    if not profiled.empty:
        advice += _communication(profiled, frames) + _embeddings(profiled, frames)
        advice += _waiting(profiled, frames) + _input(profiled) + _other(profiled)
    advice += late_worker_findings(frames)
    cpu = _cpu(frames)
    if cpu:  # replicas on CPU devices with the cores saturated
        advice = [
            _as_contention(item) if item.code in _CONTENTION_CODES else item for item in advice
        ]
    return advice + _gpu(frames) + cpu + _batching(frames) + _steps(frames)


def advise(frames, scaling: pd.DataFrame | None = None) -> list[Finding]:
    """The advisor's findings for the runs in ``frames``, worst first.

    With several runs, each run's findings say which run they are about.

    Args:
        frames: a ``RunFrames`` (``analysis.run_frames``).
        scaling: the runs by replica count (``summary.scaling_table``,
            ``Report.compare()``): adds the scaling finding.

    Returns:
        A list of ``Finding``, worst first (without the job findings:
        ``analysis.run_advice.advise_run`` adds them).

    Example:

    ```python
    from keras_dp_tools.analysis.advice import advise
    from keras_dp_tools.analysis.run_frames import load_run_frames

    for item in advise(load_run_frames([("runs/demo/keras_dp/worker-0.jsonl", 0)])):
        print(item)
    ```
    """
    runs = list(frames.runs["run"].drop_duplicates())
    if len(runs) <= 1:
        advice = _run_advice(frames)
    else:
        advice = []
        for run in runs:
            part = frames.for_run(run)
            replicas = part.runs["replicas"].max()
            where = f"run {run} ({replicas} replicas): "
            advice += [replace(item, evidence=where + item.evidence) for item in _run_advice(part)]
    advice += _scaling(frames, scaling)
    return sorted(advice, key=lambda item: -item.severity.level)


def advice_markdown(advice: list[Finding]) -> str:
    """The findings as a markdown list (TensorBoard's Text tab, HTML reports)."""
    if not advice:
        return "No findings: nothing stands out in the recorded numbers."
    return "\n".join(item.to_markdown() for item in advice)
