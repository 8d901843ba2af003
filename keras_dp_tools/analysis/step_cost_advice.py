"""Two causes of slow data-parallel steps that users hit most, told apart by what the
step's time is made of (issue 36's causes 1 and 2):

* **too little work per step** (``too-little-work``): each replica computes for a small
  part of the step, and the rest is the step's fixed costs (the all-reduce's latency
  beyond its transfer, dispatch, idle and scheduling gaps): more replicas only add
  overhead, a larger per-replica batch or ``steps_per_execution`` spreads it;
* **input that does not scale** (``input-not-scaling``): Python makes the batches (a
  ``PyDataset``/``Sequence``, a generator, ``tf.py_function``), named from the run
  header (``capture.input_pipeline``); Python holds the interpreter's lock, so its
  time shows as the host's gaps (``other_ms``) or input waits, and more replicas or
  larger batches make it worse, never better.

Both read one run: its header row (``RunFrames.runs``) and its profiled steps (rows with
a breakdown). Each finding carries ``explains_ms_per_step``, the part of the step it
accounts for, so the advisor can rank it against the others.
"""

from __future__ import annotations

import pandas as pd

from keras_dp_tools.common.findings import Advice, Finding

# Compute below this share of the step: the replicas mostly wait on fixed costs.
COMPUTE_SHARE_LOW = 0.5
# The per-replica batch the fix proposes, as a multiple of the measured one.
LARGER_BATCH = 4
# The fixed costs must be the largest part of what is not compute (else the transfer or
# the input is the cause, and their findings say so).
_FIXED_PARTS = ("latency_ms", "other_ms")


def step_costs(profiled: pd.DataFrame) -> dict[str, float] | None:
    """Medians over a run's profiled steps of the parts of a step, ms: ``step_ms`` (the
    trace's), ``compute_ms``, ``transfer_ms`` (the all-reduce's exposed transfer),
    ``latency_ms`` (its exposed time beyond the transfer: latency and waits),
    ``input_ms``, ``other_ms``; None without profiled steps.

    Example:

    >>> import pandas as pd
    >>> steps = pd.DataFrame({"trace_step_ms": [20.0], "compute_ms": [5.0],
    ...     "exposed_allreduce_ms": [4.0], "exposed_transfer_ms": [1.0],
    ...     "input_ms": [0.5], "other_ms": [10.5]})
    >>> step_costs(steps)["latency_ms"]
    3.0
    """
    rows = profiled.dropna(subset=["trace_step_ms", "compute_ms"])
    if rows.empty:
        return None

    def median(name: str) -> float:
        value = rows[name].median() if name in rows else float("nan")
        return 0.0 if pd.isna(value) else float(value)

    exposed, transfer = median("exposed_allreduce_ms"), median("exposed_transfer_ms")
    return {
        "step_ms": median("trace_step_ms"),
        "compute_ms": median("compute_ms"),
        "transfer_ms": transfer,
        "latency_ms": max(0.0, exposed - transfer),
        "input_ms": median("input_ms"),
        "other_ms": median("other_ms"),
    }


def python_input(header: pd.Series) -> list[str]:
    """The parts of the run's input that run Python (the header's ``input_python``)."""
    parts = header.get("input_python")
    if parts is None or not pd.api.types.is_list_like(parts):
        return []
    return [str(part) for part in parts]


def python_input_findings(header: pd.Series, costs: dict[str, float] | None) -> list[Finding]:
    """``input-not-scaling`` when Python makes the run's batches and the host's time
    (input waits and gaps) is a large part of its steps.

    Args:
        header: the run's header row (``input_kind``, ``input_python``,
            ``input_workers``, ``input_multiprocessing``, ``input_prefetch``).
        costs: ``step_costs`` of its profiled steps (None: no breakdown; then the
            finding says what feeds the run without timing it).
    """
    producers = python_input(header)
    if not producers:
        return []
    host_ms = costs["input_ms"] + costs["other_ms"] if costs else None
    if costs and not host_ms >= costs["compute_ms"]:
        return []  # the replicas compute longer than the host spends: not the bound
    producer = producers[0]
    evidence = f"the batches come from {producer} (Python"
    workers = header.get("input_workers")
    if pd.notna(workers) and workers:
        processes = header.get("input_multiprocessing") is True
        how = ("process", "processes") if processes else ("thread", "threads")
        evidence += f", {int(workers)} {how[0] if int(workers) == 1 else how[1]}"
    evidence += ")"
    if costs:
        evidence += (
            f"; the host spends {host_ms:.1f} ms of each {costs['step_ms']:.1f} ms step "
            f"waiting for input or between ops, against {costs['compute_ms']:.1f} ms of "
            "compute per replica (median of profiled steps)"
        )
    evidence += ". Python holds the interpreter's lock: more replicas or larger batches "
    evidence += "ask more of one producer."
    return [
        Advice(
            "warning",
            "Input that does not scale: Python makes the batches",
            evidence,
            _input_fix(header, producer),
            code="input-not-scaling",
            explains_ms_per_step=host_ms,
        )
    ]


def _input_fix(header: pd.Series, producer: str) -> str:
    if header.get("input_kind") == "py_dataset":
        fix = (
            "Build the input with tf.data from arrays or files (from_tensor_slices, or "
            "TFRecords with interleave and map(..., num_parallel_calls=tf.data.AUTOTUNE), "
            "then prefetch(tf.data.AUTOTUNE))"
        )
        if header.get("input_multiprocessing") is not True:
            fix += "; at least run the PyDataset in processes (use_multiprocessing=True)"
        return fix + "."
    if "from_generator" in producer or header.get("input_kind") == "generator":
        return (
            "Read the data with tf.data instead of a Python generator (list_files + "
            "interleave(num_parallel_calls=tf.data.AUTOTUNE), parallel map), or convert it "
            "once to arrays or TFRecords; prefetch after a generator adds no parallelism."
        )
    return (
        "Replace the Python function in the pipeline with TensorFlow ops (tf.image, "
        "tf.strings, tf.io), so map(..., num_parallel_calls=tf.data.AUTOTUNE) runs it in "
        "parallel, then prefetch(tf.data.AUTOTUNE)."
    )


def work_findings(
    header: pd.Series,
    costs: dict[str, float] | None,
    custom_loop: bool = False,
    larger_batch_gain: float | None = None,
) -> list[Finding]:
    """``too-little-work`` when each replica computes for less than half of the step and
    the step's fixed costs (all-reduce latency, dispatch, idle and scheduling gaps) are
    the largest part of the rest; not when Python makes the batches (a larger batch
    would ask more of it: ``python_input_findings`` speaks then).

    Args:
        header: the run's header row (``replicas``, ``global_batch``,
            ``steps_per_execution``, ``keras_package``).
        costs: ``step_costs`` of its profiled steps.
        custom_loop: the steps are a custom loop's (``kdt.TrainingLoop``): the finding
            is ``loop-host-sync``, with a custom loop's fix (several steps per
            ``tf.function`` call, metrics read every N steps).
        larger_batch_gain: the throughput ``analysis.what_if`` predicts at
            ``LARGER_BATCH`` times the per-replica batch, over the measured one.
    """
    if not costs or python_input(header) or not costs["step_ms"] > 0:
        return []
    replicas = int(header.get("replicas") or 1)
    if replicas < 2 or not costs["compute_ms"] < COMPUTE_SHARE_LOW * costs["step_ms"]:
        return []
    fixed_ms = sum(costs[name] for name in _FIXED_PARTS)
    if not fixed_ms > max(costs["transfer_ms"], costs["input_ms"]):
        return []
    batch = header.get("global_batch")
    per_replica = int(batch) // replicas if pd.notna(batch) and batch else None
    evidence = (
        f"each replica computes {costs['compute_ms']:.1f} ms of a {costs['step_ms']:.1f} ms "
        f"step ({costs['compute_ms'] / costs['step_ms']:.0%})"
        + (f" on {per_replica} examples" if per_replica else "")
        + f"; {fixed_ms:.1f} ms are fixed per-step costs (all-reduce latency and waits "
        f"{costs['latency_ms']:.1f} ms, dispatch and gaps {costs['other_ms']:.1f} ms; median "
        "of profiled steps) that do not shrink with more replicas"
    )
    if larger_batch_gain is not None and per_replica:
        evidence += (
            f"; at {LARGER_BATCH * per_replica} examples per replica what_if predicts "
            f"{larger_batch_gain:.1f}x the examples/s"
        )
    evidence += "."
    if custom_loop:
        return [
            Advice(
                "warning",
                "Custom loop: each step's call and host round trip outweigh compute",
                evidence,
                _loop_fix(per_replica),
                code="loop-host-sync",
                explains_ms_per_step=fixed_ms,
            )
        ]
    return [
        Advice(
            "warning",
            "Too little work per step: fixed costs outweigh compute",
            evidence,
            _work_fix(header, per_replica),
            code="too-little-work",
            explains_ms_per_step=fixed_ms,
        )
    ]


def _loop_fix(per_replica: int | None) -> str:
    fix = (
        "Run several steps per tf.function call (a `for _ in tf.range(k):` loop over "
        "next(iterator) and strategy.run inside the function), and read the loss and "
        "metrics on the host every N steps, not after every step (each float(loss) or "
        ".numpy() waits for the step to finish before the next is sent)"
    )
    if per_replica:
        fix += f"; a larger per-replica batch (now {per_replica}) also spreads the fixed costs"
    return fix + "."


def _work_fix(header: pd.Series, per_replica: int | None) -> str:
    if per_replica:
        fix = (
            f"Give each replica more examples per step: batch_size = "
            f"{LARGER_BATCH * per_replica} * "
            f"strategy.num_replicas_in_sync (now {per_replica} per replica), with the "
            "learning rate scaled (kdt.plan_scaling)"
        )
    else:
        fix = "Give each replica more examples per step (a larger per-replica batch)"
    keras3 = header.get("keras_package") == "keras"
    if not keras3:  # Keras 3 fails fit under MirroredStrategy with it (keras#19246)
        fix += "; run several steps per call (compile(steps_per_execution=8))"
    return fix + "; for a model this small, fewer replicas may train faster."
