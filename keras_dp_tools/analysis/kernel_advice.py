"""Kernels slower under the strategy (issue 36's cause 6): at the same per-replica batch,
each example costs more compute with more replicas, and the mix of op types changed.

A kernel that a layer picks by its context can change under ``tf.distribute``:
Keras's cuDNN GRU fell back to the generic per-time-step kernel under MirroredStrategy
(tensorflow/tensorflow#40421). Compute per example then rises from one replica to N at
one per-replica batch. On logical CPU devices, and on a GPU shared by its replicas,
contention raises it too, but evenly across op types; a different kernel changes
*which* op types the time goes to. So the finding needs both: compute per example up by
``COMPUTE_RISE``, and the op-type mix moved by ``MIX_CHANGE`` (total variation distance
between the two runs' shares of compute time by op type). The op types come from each
run's first analysed profiler window (its ``.xplane.pb``).

Pure functions over a ``RunFrames`` and the traces its windows name; no TensorFlow.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pandas as pd

from keras_dp_tools.analysis.breakdown.classify import (
    Kind,
    classify_device_event,
    classify_host_event,
    op_type_of,
)
from keras_dp_tools.analysis.trace.xspace import gpu_planes, host_planes, load_xspace, plane_events
from keras_dp_tools.common.findings import Advice, Finding

# Above what two runs of one model at one replica count differ by on a shared 2-core
# machine (compute per example up to 1.63x apart, op-type mix up to 0.27 apart over a
# 5-step window: benchmarks/NOTES.md, "Kernels slower under the strategy").
COMPUTE_RISE = 1.5  # compute per example at N replicas over at the fewest
MIX_CHANGE = 0.3  # total variation distance of the op-type shares of compute time
_TOP = 3  # op types named in the evidence


def op_type_ms(trace: str | Path) -> pd.Series:
    """Compute time by op type in a trace, ms: TF ops on the host planes of a CPU-device
    run, kernels on the GPU planes (by the TF op they belong to, where the trace says).

    Args:
        trace: an ``.xplane.pb`` file.

    Returns:
        A Series op type -> ms, largest first; empty when the trace has no compute op.
    """
    space = load_xspace(trace)
    times: Counter = Counter()
    for plane in host_planes(space):
        for event in plane_events(plane):
            kind = classify_host_event(event)
            if kind is not None and kind[0] is Kind.COMPUTE:
                times[op_type_of(event.name)] += (event.end_ps - event.start_ps) / 1e9
    for plane in gpu_planes(space).values():
        for event in plane_events(plane):
            if classify_device_event(event) is Kind.COMPUTE:
                name = str(event.stats.get("tf_op", event.name))
                times[op_type_of(name)] += (event.end_ps - event.start_ps) / 1e9
    return pd.Series(times, dtype=float).sort_values(ascending=False)


def mix_change(before: pd.Series, after: pd.Series) -> float:
    """Total variation distance between two runs' shares of compute time by op type:
    0 when every op type keeps its share, 1 when they share no op type.

    Example:

    >>> import pandas as pd
    >>> mix_change(pd.Series({"MatMul": 3.0, "Add": 1.0}), pd.Series({"MatMul": 6.0, "Add": 2.0}))
    0.0
    """
    shares = pd.concat([before / before.sum(), after / after.sum()], axis=1).fillna(0.0)
    return float(0.5 * (shares.iloc[:, 0] - shares.iloc[:, 1]).abs().sum())


def kernel_findings(frames) -> list[Finding]:
    """``slower-kernels`` for the runs of ``frames`` that differ in replica count at one
    per-replica batch: the run with the fewest replicas against the one with the most.

    Args:
        frames: a ``RunFrames`` holding two or more runs, each with an analysed profiler
            window whose trace is still on disk (``windows.trace`` under the log dir).

    Returns:
        The finding, or empty (fewer than two such runs, other per-replica batches, a
        trace gone, or compute per example and the op-type mix within their lines).
    """
    runs = _profiled_runs(frames)
    if len(runs) < 2:
        return []
    base, most = runs.iloc[0], runs.iloc[-1]
    if base["replicas"] == most["replicas"] or base["per_replica"] != most["per_replica"]:
        return []
    try:
        before, after = _per_example(base), _per_example(most)
    except (OSError, ValueError):  # the trace was moved or is damaged: say nothing
        return []
    if before.empty or after.empty:
        return []
    rise = after.sum() / before.sum()
    change = mix_change(before, after)
    if not (rise >= COMPUTE_RISE and change >= MIX_CHANGE):
        return []
    grown = after.sub(before, fill_value=0.0).sort_index()  # ties by name
    grown = grown.sort_values(ascending=False, kind="stable").head(_TOP)
    new = sorted(
        op for op in after.index if op not in before.index and after[op] > 0.01 * after.sum()
    )
    evidence = (
        f"at {int(most['per_replica'])} examples per replica, compute per example rose "
        f"{rise:.2f}x from {int(base['replicas'])} to {int(most['replicas'])} replicas "
        f"({before.sum():.0f} to {after.sum():.0f} µs), and the op types it goes to changed "
        f"(the shares of compute time moved by {change:.0%}; contention alone slows op "
        "types alike); grew most: "
        + ", ".join(f"{op} +{value:.0f} µs per example" for op, value in grown.items())
    )
    if new:
        evidence += f"; op types not run at {int(base['replicas'])} replica(s): " + ", ".join(new)
    extra_ms = most["compute_ms"] - base["compute_ms"]
    return [
        Advice(
            "warning",
            "Kernels slower under the strategy: compute per example rises with replicas",
            evidence + ".",
            "Find why the kernels differ under the strategy: compare the op types of the "
            "one-replica and the distributed run (the Profile tab's op profile of each). "
            "A known cause: Keras's cuDNN GRU/LSTM falls back to the generic kernel under "
            "MirroredStrategy on some TensorFlow versions (tensorflow/tensorflow#40421): "
            "upgrade TensorFlow, keep the layer cuDNN-eligible (activation='tanh', "
            "recurrent_activation='sigmoid', recurrent_dropout=0, unroll=False, "
            "use_bias=True, reset_after=True) and use keras.layers.GRU/LSTM rather than "
            "RNN(cell).",
            code="slower-kernels",
            explains_ms_per_step=float(extra_ms) if pd.notna(extra_ms) and extra_ms > 0 else None,
        )
    ]


def compute_per_example(frames) -> pd.Series:
    """Compute per example by op type, µs, of the first run of ``frames`` with an
    analysed profiler window (its trace read from disk).

    Args:
        frames: a ``RunFrames`` (``Report.frames``).

    Returns:
        A Series op type -> µs per example (over the window's steps and this worker's
        replicas); empty without an analysed window.

    Raises:
        OSError: the window's trace is not where its record says.
    """
    runs = _profiled_runs(frames)
    return _per_example(runs.iloc[0]) if len(runs) else pd.Series(dtype=float)


def _per_example(run: pd.Series) -> pd.Series:
    examples = run["steps_analysed"] * run["local_replicas"] * run["per_replica"]
    if not examples > 0:
        return pd.Series(dtype=float)
    return op_type_ms(run["trace_path"]) / examples * 1e3


def _profiled_runs(frames) -> pd.DataFrame:
    """One row per run with an analysed window: replicas, per-replica batch, the
    median compute per replica, and its first window's trace, by replica count."""
    windows = frames.windows
    if windows.empty or "trace" not in windows:
        return pd.DataFrame()
    analysed = windows[(windows["status"] == "analysed") & windows["trace"].notna()]
    analysed = analysed.drop_duplicates("run", keep="first")
    rows = []
    profiled = frames.step_parts.profiled
    for window in analysed.itertuples():
        header = frames.runs[frames.runs["run"] == window.run]
        if header.empty or pd.isna(header["global_batch"].iloc[0]):
            continue
        replicas = int(header["replicas"].iloc[0])
        mine = profiled[profiled["run"] == window.run] if "run" in profiled else profiled
        compute = mine["compute_ms"].median() if "compute_ms" in mine else float("nan")
        local = getattr(window, "local_replicas", None)
        rows.append(
            {
                "run": window.run,
                "replicas": replicas,
                "per_replica": int(header["global_batch"].iloc[0]) // replicas,
                "local_replicas": int(local) if pd.notna(local) else replicas,
                "steps_analysed": window.steps_analysed,
                "compute_ms": compute,
                "trace_path": Path(window.source).parent.parent / window.trace,
            }
        )
    return pd.DataFrame(rows).sort_values("replicas", kind="stable") if rows else pd.DataFrame()
