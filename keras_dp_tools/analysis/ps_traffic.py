"""What a parameter-server worker waits for: its steps, read from a profile of the
worker, and the bytes its steps move between it and the parameter servers.

What TensorFlow 2.21 records on a ParameterServerStrategy worker (a
``tf.distribute.Server`` traced with ``tf.profiler.experimental.client.trace``; seen on
a real run of ``_ps_trial``), all on the host plane:

- each scheduled training function as ``EagerLocalExecute: __inference_train_function_<n>``
  on a ``tf_Compute`` line: the worker's step, from the coordinator's request until the
  function, its parts on the parameter servers included, has finished;
- each value received from a parameter server (a variable, a metric's value, a control
  edge) as a ``_Recv`` kernel that runs asynchronously:
  ``ExecutorState::ProcessAsync::Start`` (stats ``kernel_type`` = ``_Recv``, ``name``,
  ``step_id``, ``_p``) on the compute line when the worker asks for the value, and
  ``ExecutorState::ProcessAsync::Done`` (``_c`` equal to that ``_p``) on a gRPC queue
  line when it has arrived;
- each gradient (and metric update) pushed to a parameter server as a ``_Send`` op
  (``<op>/_<n>:_Send``) whose ``key`` stat names the destination,
  ``src_device;incarnation;/job:ps/replica:0/task:<i>/device:CPU:0;edge;0:0``. A
  ``_Send`` only hands the tensor over: the parameter server pulls it afterwards, and
  applies it; the worker's function ends when that is done;
- the worker's own ops as ``<scope>/<op>:<OpType>`` events.

No event carries the size of what a ``_Recv`` or ``_Send`` moved, and there are no
``RecvTensor`` RPC events; ``MemoryAllocation`` events have sizes, but not for every
tensor (on the run looked at, a 256 kB kernel's and none of the 1 kB biases'). So the
bytes come from the model's sizes (``transfer_bytes``), and the trace gives the counts
of reads and pushes per step and the time the worker waits.

Per step, the worker's own work ends with its last op or ``_Send``.
``read_wait_ms``: the time before it during which a read is pending and the worker
computes nothing (``compute_ms``: the union of its ops, sends and receives left out).
``push_wait_ms``: from it to the end of the step, while the parameter servers pull the
gradients and apply them; reads still pending then (every ``_Recv`` starts with the
step, and the metrics' values come after the update) wait for that too. ``comm_ms``:
both. On a real run over a 200 Mbit/s link (``benchmarks/strategies_netns.py``), 9
``_Recv`` per step: the 6 variables, 2 metric values and a control edge.
"""

from __future__ import annotations

import bisect
import re
import statistics
from collections.abc import Iterable

import numpy as np
import pandas as pd

from keras_dp_tools.analysis.breakdown.intervals import union_lengths
from keras_dp_tools.analysis.trace.xspace import TraceEvent, host_planes, load_xspace, plane_events

STEP_PREFIX = "EagerLocalExecute: "
STEP_FUNCTION = "train_function"
ASYNC_START = "ExecutorState::ProcessAsync::Start"
ASYNC_DONE = "ExecutorState::ProcessAsync::Done"
RECV = "_Recv"
SEND_SUFFIX = ":_Send"
PS_JOB = "/job:ps/"
# A TF op event: "<scope>/<op>:<OpType>", no spaces and no "::" (TraceMe names have them).
_OP_EVENT = re.compile(r"^[^\s:]+:[A-Za-z_]\w*$")
_PS_PER_MS = 1e9

PS_WORKER_STEP_COLUMNS = [
    "start_ps",
    "end_ps",
    "step_ms",
    "compute_ms",
    "read_wait_ms",
    "push_wait_ms",
    "comm_ms",
    "reads",
    "pushes",
]


def _is_step(event: TraceEvent) -> bool:
    return event.name.startswith(STEP_PREFIX) and STEP_FUNCTION in event.name


def _is_push(event: TraceEvent) -> bool:
    if not event.name.endswith(SEND_SUFFIX):
        return False
    parts = str(event.stats.get("key", "")).split(";")
    return len(parts) > 2 and PS_JOB in parts[2] + "/"


def _union_ps(spans: list[tuple[int, int]]) -> int:
    if not spans:
        return 0
    spans = sorted(spans)
    starts = np.array([s for s, _ in spans], dtype=np.int64)
    ends = np.array([e for _, e in spans], dtype=np.int64)
    return int(union_lengths(np.zeros(len(spans), dtype=np.int64), starts, ends, 1)[0])


def _exposed_ps(waits: list[tuple[int, int]], busy: list[tuple[int, int]]) -> int:
    """|union(waits) minus union(busy)| = |waits ∪ busy| - |busy|."""
    return _union_ps(waits + busy) - _union_ps(busy)


def worker_steps(events: Iterable[TraceEvent]) -> pd.DataFrame:
    """One row per training step the traced worker ran (``PS_WORKER_STEP_COLUMNS``), in time
    order. A worker runs one scheduled function at a time, so an event belongs to the
    step whose span holds its start."""
    events = list(events)
    steps = sorted((e for e in events if _is_step(e)), key=lambda e: e.start_ps)
    done = {
        e.stats.get("_c"): e.end_ps
        for e in events
        if e.name == ASYNC_DONE and e.stats.get("kernel_type") == RECV
    }
    reads, sends, pushes, ops = [], [], [], []
    for event in events:
        if event.name == ASYNC_START and event.stats.get("kernel_type") == RECV:
            # "_recv_<arg>" kernels receive the function's arguments, not variables.
            if not str(event.stats.get("name", "")).startswith("_recv_"):
                end = done.get(event.stats.get("_p"))
                if end is not None:
                    reads.append((event.start_ps, end))
        elif event.name.endswith(SEND_SUFFIX):
            sends.append((event.start_ps, event.end_ps))
            if _is_push(event):
                pushes.append((event.start_ps, event.end_ps))
        elif _OP_EVENT.match(event.name) and not event.name.endswith(":" + RECV):
            ops.append((event.start_ps, event.end_ps))
    starts = [step.start_ps for step in steps]

    def by_step(spans):
        """Spans by the step their start lies in, clipped to it, in ps from its start
        (absolute picoseconds overflow int64)."""
        grouped: list[list[tuple[int, int]]] = [[] for _ in steps]
        for start, end in spans:
            index = bisect.bisect_right(starts, start) - 1
            if index >= 0 and start < steps[index].end_ps:
                base, stop = steps[index].start_ps, steps[index].end_ps
                grouped[index].append((start - base, min(end, stop) - base))
        return grouped

    rows = []
    for step, step_reads, step_sends, step_pushes, step_ops in zip(
        steps, by_step(reads), by_step(sends), by_step(pushes), by_step(ops), strict=True
    ):
        length = step.end_ps - step.start_ps
        # The worker's own work ends with its last op or send; the rest is waiting.
        last_busy = max((end for _, end in step_ops + step_sends), default=0)
        # A read still pending after that waits for the parameter servers to apply the
        # pushes first (the metrics' values): it counts as push wait.
        early_reads = [(start, min(end, last_busy)) for start, end in step_reads]
        read_wait = _exposed_ps(early_reads, step_ops)
        push_wait = length - last_busy if step_ops else 0
        rows.append(
            {
                "start_ps": step.start_ps,
                "end_ps": step.end_ps,
                "step_ms": length / _PS_PER_MS,
                "compute_ms": _union_ps(step_ops) / _PS_PER_MS,
                "read_wait_ms": read_wait / _PS_PER_MS,
                "push_wait_ms": push_wait / _PS_PER_MS,
                "comm_ms": (read_wait + push_wait) / _PS_PER_MS,
                "reads": len(step_reads),
                "pushes": len(step_pushes),
            }
        )
    return pd.DataFrame(rows, columns=PS_WORKER_STEP_COLUMNS)


def worker_steps_from_trace(path) -> pd.DataFrame:
    """``worker_steps`` of the host plane(s) of one ``.xplane.pb`` file."""
    space = load_xspace(path)
    return worker_steps(e for plane in host_planes(space) for e in plane_events(plane))


def transfer_bytes(variable_bytes: int, workers: int) -> dict:
    """The bytes one step (a batch on each of ``workers`` workers) moves between the
    workers and the parameter servers, from the model's sizes: each worker reads every
    trainable variable once (``read_bytes``) and pushes a gradient of the same size
    (``push_bytes``). Embedding tables move only the rows a batch touches, so for them
    this is an upper bound."""
    read = push = int(variable_bytes) * int(workers)
    return {"read_bytes": read, "push_bytes": push, "bytes_per_step": read + push}


def ps_evidence(steps: pd.DataFrame, variable_bytes: int, workers: int) -> dict:
    """The candidate's evidence: medians over the traced worker's steps (``step_ms``,
    ``compute_ms``, ``read_wait_ms``, ``push_wait_ms``, ``comm_ms``, reads and pushes per
    worker step, ``dispatch_gap_ms``: the worker idle between two steps, waiting for the
    coordinator's next one) and the bytes (``transfer_bytes``, ``bytes_source`` "model
    sizes"). Without traced steps, only the bytes and a ``note``."""
    evidence = {**transfer_bytes(variable_bytes, workers), "bytes_source": "model sizes"}
    evidence.update(variable_bytes=int(variable_bytes), workers=int(workers))
    if steps.empty:
        evidence["note"] = "the worker's trace held no complete training step"
        return evidence
    for column in ("step_ms", "compute_ms", "read_wait_ms", "push_wait_ms", "comm_ms"):
        evidence[column] = float(steps[column].median())
    evidence["reads_per_worker_step"] = float(steps["reads"].median())
    evidence["pushes_per_worker_step"] = float(steps["pushes"].median())
    starts, ends = steps["start_ps"].tolist(), steps["end_ps"].tolist()
    gaps = [(start - end) / _PS_PER_MS for start, end in zip(starts[1:], ends[:-1], strict=True)]
    if gaps:
        evidence["dispatch_gap_ms"] = statistics.median(gaps)
    evidence["trace_steps"] = len(steps)
    return evidence
