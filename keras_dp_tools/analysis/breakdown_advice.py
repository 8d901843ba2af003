"""The advisor's findings from the profiled steps' breakdown: communication, replicas
not synchronised, embedding gathers, waits for the slowest replica, input, and time
outside them all. Thresholds are module constants, so a finding says which line it
crossed.

Pure functions over a run's frames (``analysis.run_frames.RunFrames``); no TensorFlow.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pandas as pd

from keras_dp_tools.analysis.breakdown.bandwidth import NO_BYTES, NO_REDUCE
from keras_dp_tools.common.findings import Advice, Finding
from keras_dp_tools.common.known_bugs import ALLREDUCE_BUG, ALLREDUCE_FIX, drops_gradient_allreduce

COMM_SHARE_HIGH = 0.20  # exposed all-reduce transfer over step time
WAIT_SHARE_HIGH = 0.15  # exposed waiting for the slowest replica over step time
INPUT_SHARE_HIGH = 0.10  # exposed input wait over step time
STRAGGLER_SHARE = 0.6  # one replica last to arrive in this share of profiled steps
GATHER_SHARE_HIGH = 0.10  # all-gather of sparse gradients over step time: medium, else info
OTHER_SHARE_HIGH = 0.40  # time outside compute, communication and input over step time
_TABLE_SIZE = re.compile(r"\((\d+)x(\d+)\)")


def _median_ms(values: pd.Series) -> float | None:
    """A median in ms for ``explains_ms_per_step``; None where nothing was measured."""
    median = values.median()
    return None if pd.isna(median) else float(median)


def profiled_steps(frames) -> pd.DataFrame:
    """The steps a profiler window analysed (a breakdown), every column.

    Args:
        frames: a ``RunFrames``.

    Returns:
        The rows of ``frames.step_parts.profiled`` with a ``trace_step_ms``.
    """
    steps = frames.step_parts.profiled
    return steps[steps["trace_step_ms"].notna()] if "trace_step_ms" in steps else steps.iloc[:0]


def communication_findings(profiled: pd.DataFrame) -> list[Finding]:
    """Exposed all-reduce transfer over ``COMM_SHARE_HIGH`` of the step (median), with
    the gradients' bytes per step and the bus bandwidth where it is known.

    Args:
        profiled: ``profiled_steps`` of the run.

    Returns:
        The finding, or empty.
    """
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
            "warning",
            "Communication-bound: gradients take a large share of each step",
            evidence,
            fix,
            code="communication-bound",
            explains_ms_per_step=_median_ms(profiled["comm_share"] * profiled["trace_step_ms"]),
        )
    ]
    return advice


def unsynchronised_findings(profiled: pd.DataFrame, frames) -> list[Finding]:
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
            "error",
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


def embedding_findings(profiled: pd.DataFrame, frames) -> list[Finding]:
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
    severity = "warning" if share >= GATHER_SHARE_HIGH else "info"
    title = f"Embedding gradients are all-gathered ({layers})"
    explains = _median_ms(gathered["gather_ms"])
    finding = Advice(severity, title, evidence, fix, code="embedding-gather")
    return [replace(finding, explains_ms_per_step=explains)]


def other_time_findings(profiled: pd.DataFrame) -> list[Finding]:
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
    return [Advice("warning", "Most of the step is outside compute and communication",
                   evidence + ".", fix[0].upper() + fix[1:] + ".", code="other-time",
                   explains_ms_per_step=_median_ms(profiled["other_ms"]))]  # fmt: skip


def waiting_findings(profiled: pd.DataFrame, frames) -> list[Finding]:
    """Replicas waiting for the slowest one over ``WAIT_SHARE_HIGH`` of the step, and a
    replica last to arrive in ``STRAGGLER_SHARE`` of the profiled steps.

    Args:
        profiled: ``profiled_steps`` of the run.
        frames: the run's ``RunFrames``.

    Returns:
        The findings (empty when nothing crosses its line).
    """
    advice = []
    share = profiled["wait_share"].median()
    if share >= WAIT_SHARE_HIGH:
        advice.append(
            Advice(
                "warning",
                "Replicas wait for each other at the all-reduce",
                f"exposed sync wait is {share:.0%} of the step (median); the slowest "
                f"replica kept the others waiting {profiled['max_sync_wait_ms'].median():.2f} "
                "ms per step.",
                "Balance the work per replica: the same per-replica batch and sequence "
                "lengths, input prepared ahead (prefetch), no other jobs on the devices; "
                "see the straggler view (keras_dp_tools.report.plots.sync_wait).",
                code="replica-wait",
                explains_ms_per_step=_median_ms(profiled["wait_share"] * profiled["trace_step_ms"]),
            )
        )
    stragglers = profiled["straggler_replica"].dropna()
    if len(stragglers) >= 3:
        counts = stragglers.value_counts()
        replica, times = int(counts.index[0]), int(counts.iloc[0])
        if times / len(stragglers) >= STRAGGLER_SHARE and frames.runs["replicas"].max() > 2:
            advice.append(
                Advice(
                    "warning",
                    f"Replica {replica} is a straggler",
                    f"it arrived last at the all-reduce in {times} of {len(stragglers)} "
                    "profiled steps.",
                    f"Check the device of replica {replica}: clocks and temperature "
                    "(Report.gpu), another process on it, or a slower link.",
                    code="replica-straggler",
                    explains_ms_per_step=_median_ms(profiled["max_sync_wait_ms"]),
                )
            )
    return advice


def input_findings(profiled: pd.DataFrame) -> list[Finding]:
    """Exposed input wait over ``INPUT_SHARE_HIGH`` of the step (median).

    Args:
        profiled: ``profiled_steps`` of the run.

    Returns:
        The finding, or empty.
    """
    share = (profiled["input_ms"] / profiled["trace_step_ms"]).median()
    if not share >= INPUT_SHARE_HIGH:
        return []
    return [
        Advice(
            "warning",
            "Input-bound: steps wait for data",
            f"exposed input wait is {share:.0%} of the step (median of profiled steps).",
            "dataset.prefetch(tf.data.AUTOTUNE) last; map(..., num_parallel_calls="
            "tf.data.AUTOTUNE); cache() after expensive, deterministic steps; interleave "
            "file reads; decode and augment on fewer, larger batches.",
            code="input-bound",
            explains_ms_per_step=_median_ms(profiled["input_ms"]),
        )
    ]
