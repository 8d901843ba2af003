"""Where a trace's steps come from, for any TensorFlow capture, first found first:

1. ``kdp_marker``: our profiler's markers (``Trace("train", step_num=n, _r=1, kdp=1)``);
2. ``train_marker``: ``Trace("train", step_num=n, _r=1)`` without ours, as tf_keras's
   ``fit`` marks every step (numbered within the epoch) and as users write them;
3. ``profiled_batch``: Keras 3's ``TensorBoard(profile_batch=...)`` marks each profiled
   batch ``Trace("Profiled batch", step_num=<batch in the epoch>)``, without ``_r``, so
   XProf does not take it as a step (keras-team/keras#19476);
4. XProf's own step grouping (``tsl/profiler/utils/group_events.cc``), from the
   executor's events:

   * ``group_id``: the events of a capture grouped when it was written (older
     TensorFlow grouped before saving) carry a ``group_id``: each group of
     ``ExecutorState::Process`` events is a step;
   * ``iter_num``: a function running a loop (``ExecutorState::Process`` events of one
     ``step_id`` with ``iter_num`` other than 0) has one step per iteration;
   * ``function_run``: else each root call (``FunctionRun`` with ``_r``), one
     ``tf.function`` call, not inside another root on its thread, not on a tf.data
     thread, that ran executor work (an ``ExecutorState::Process`` outside tf.data
     threads in its context, ``_c``/``_ct`` = its ``_p``/``_pt``), lasting until that
     work ended; a call made while the previous one's work still ran joins its step;

5. ``whole_capture``: the capture as one step (step 0), from its first host event to
   its last.

The steps are ``StepMarker`` s either way: the step engine treats them alike.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace

from keras_dp_tools.analysis.trace.xspace import StepMarker, TraceEvent, step_markers
from keras_dp_tools.records.contract import OWN_MARKER_STAT, STEP_EVENT_NAME

PROFILED_BATCH = "Profiled batch"  # Keras 3's TensorBoard callback (backend/tensorflow)
FUNCTION_RUN = "FunctionRun"  # one tf.function call (a root event: ``_r``)
EXECUTOR_PROCESS = "ExecutorState::Process"  # the executor running a function's ops
MARKER_NAMES = frozenset({STEP_EVENT_NAME, PROFILED_BATCH})
ROOT_NAMES = frozenset({FUNCTION_RUN, EXECUTOR_PROCESS})

# What each value of the ``step_source`` column means (docs/breakdown.md).
STEP_SOURCES = {
    "kdp_marker": "keras_dp_tools' step markers",
    "train_marker": 'Trace("train", step_num=...) markers (tf_keras fit, or your own)',
    "profiled_batch": "Keras 3 TensorBoard(profile_batch=...) batch markers",
    "group_id": "XProf's step groups written with the capture (group_id)",
    "iter_num": "XProf's step grouping: the iterations of a loop in a function (iter_num)",
    "function_run": "XProf's step grouping: one step per tf.function call (FunctionRun)",
    "whole_capture": "no step marker or step grouping: the whole capture as one step",
}
_ROOT_STAT, _GROUP, _ITER, _STEP_ID = "_r", "group_id", "iter_num", "step_id"
# The stats of the executor's events the steps are found by (contexts: ``_p``/``_pt``
# of a call, ``_c``/``_ct`` of its work).
ROOT_STATS = frozenset({_ROOT_STAT, _GROUP, _ITER, _STEP_ID, "_p", "_pt", "_c", "_ct"})
_TF_DATA_LINE = "tf_data"  # tf.data's threads: input production, not steps


@dataclass(frozen=True)
class TraceSteps:
    """A trace's steps: ``markers`` in time order and where they came from
    (``source``, a key of ``STEP_SOURCES``; None: the trace has no host events)."""

    markers: list[StepMarker]
    source: str | None


def find_steps(
    markers: Sequence[TraceEvent],
    roots: Sequence[TraceEvent],
    extent: tuple[int, int | None] | None,
) -> TraceSteps:
    """The steps of a trace, from the first source (module docstring) that has any.

    Args:
        markers: host events named as step markers (``MARKER_NAMES``), with stats.
        roots: host ``FunctionRun`` and ``ExecutorState::Process`` events, with stats.
        extent: the host events' earliest start and latest end (absolute ps) other
            than the markers', as ``host_reading.read_host`` gives it; None: no events.

    Returns:
        A ``TraceSteps``.
    """
    for source, names, own in (
        ("kdp_marker", {STEP_EVENT_NAME}, True),
        ("train_marker", {STEP_EVENT_NAME}, False),
        ("profiled_batch", {PROFILED_BATCH}, False),
    ):
        chosen = [
            event
            for event in markers
            if event.name in names
            and event.stats.get("step_num") is not None
            and (event.stats.get(OWN_MARKER_STAT) is not None) == own
        ]
        if chosen:
            return TraceSteps(step_markers(chosen, names), source)
    processes = [
        event
        for event in roots
        if event.name == EXECUTOR_PROCESS and not event.line.startswith(_TF_DATA_LINE)
    ]
    for source, find in (
        ("group_id", lambda work: _group_steps(work, roots)),
        ("iter_num", _loop_steps),
        ("function_run", lambda work: _root_steps(roots, work)),
    ):
        found = find(processes)
        if found:
            return TraceSteps(found, source)
    if extent is None:
        return TraceSteps([], None)
    first, last = extent
    return TraceSteps([StepMarker(0, first, first if last is None else last)], "whole_capture")


def _span_marker(step: int, events: Sequence[TraceEvent]) -> StepMarker:
    """A step lasting from the first of ``events`` to the last, on the first's thread."""
    head = min(events, key=lambda event: event.start_ps)
    end = max(event.end_ps for event in events)
    return StepMarker(step, head.start_ps, end, head.line, (head.plane, head.line_id))


def _group_steps(processes: Sequence[TraceEvent], roots: Sequence[TraceEvent]) -> list[StepMarker]:
    """One step per ``group_id`` the executor's events carry, numbered by it, from its
    first event to its last. Where the capture's calls (``FunctionRun``) carry groups
    too, only the groups of calls made outside tf.data's threads are steps, from the
    call on (tf.data's own functions are grouped apart: seen on a real multi-worker GPU
    capture, 4 of its 7 groups were its iterators')."""
    groups = defaultdict(list)
    for event in processes:
        group = event.stats.get(_GROUP)
        if isinstance(group, int):
            groups[group].append(event)
    calls = [event for event in roots if event.name == FUNCTION_RUN]
    if any(isinstance(call.stats.get(_GROUP), int) for call in calls):
        called = defaultdict(list)  # a group's calls outside tf.data start its step
        for call in calls:
            if not call.line.startswith(_TF_DATA_LINE):
                called[call.stats.get(_GROUP)].append(call)
        groups = {
            group: [*called[group], *work] for group, work in groups.items() if group in called
        }
    return _in_time_order(_span_marker(group, events) for group, events in groups.items())


def _loop_steps(processes: Sequence[TraceEvent]) -> list[StepMarker]:
    """One step per iteration of a loop run by a function (XProf's
    ``ProcessTensorFlowLoop``): the executor's events of one ``step_id`` and
    ``iter_num``, where that ``step_id`` ran more than iteration 0; numbered in time
    order."""
    loops = defaultdict(lambda: defaultdict(list))
    for event in processes:
        step_id, iteration = event.stats.get(_STEP_ID), event.stats.get(_ITER)
        if isinstance(step_id, int) and isinstance(iteration, int):
            loops[step_id][iteration].append(event)
    iterations = [events for loop in loops.values() if set(loop) != {0} for events in loop.values()]
    spans = sorted((_span_marker(0, events) for events in iterations), key=_start)
    return [StepMarker(n, m.start_ps, m.end_ps, m.line, m.thread) for n, m in enumerate(spans)]


def _root_steps(roots: Sequence[TraceEvent], processes: Sequence[TraceEvent]) -> list[StepMarker]:
    """One step per root ``FunctionRun`` (``_r`` set) that is not on a tf.data thread,
    not inside another root on its thread, and ran executor work: an
    ``ExecutorState::Process`` (not on a tf.data thread) whose context (``_ct``, ``_c``)
    is the call's (``_pt``, ``_p``), as XProf connects them. The executor may run after
    the call returned (seen on a loaded machine: 33 us calls, their work after them),
    so a step lasts until the last of its work ends; a call made on the thread while
    the previous call's work still ran is part of that step (seen: Keras 3's train step
    under MirroredStrategy is two calls, the second 0.05 ms after the first returned,
    their work running together). The rule can join two steps when the next one is
    dispatched before the previous one's work ended: seen once in 128 steps of a 4-CPU
    mirrored capture on a loaded machine (that row then holds two all-reduces).
    Numbered in time order."""
    calls = sorted(
        (
            event
            for event in roots
            if event.name == FUNCTION_RUN
            and event.stats.get(_ROOT_STAT)
            and not event.line.startswith(_TF_DATA_LINE)
        ),
        key=lambda event: (event.start_ps, -event.end_ps),
    )
    work_end = {}  # by context: the latest end of the executor's work in it
    for event in processes:
        context = _context(event, "_ct", "_c")
        if context is not None:
            work_end[context] = max(work_end.get(context, event.end_ps), event.end_ps)
    steps, reach = [], {}
    for call in calls:  # a root inside a root of its thread is part of that one
        thread = (call.plane, call.line_id)
        if call.start_ps < reach.get(thread, call.start_ps):
            continue
        reach[thread] = call.end_ps
        end = work_end.get(_context(call, "_pt", "_p"))
        if end is None:
            continue
        end = max(call.end_ps, end)
        last = steps[-1] if steps and steps[-1].thread == (call.plane, call.line_id) else None
        if last is not None and call.start_ps < last.end_ps:
            # Called while the previous call's work still ran: one step (Keras 3's
            # train step under MirroredStrategy runs as two calls whose work overlaps).
            steps[-1] = replace(last, end_ps=max(last.end_ps, end))
            continue
        line = (call.line, (call.plane, call.line_id))
        steps.append(StepMarker(len(steps), call.start_ps, end, *line))
    return steps


def _context(event: TraceEvent, kind: str, key: str) -> tuple[int, int] | None:
    """An event's context (type, id) from the stats named ``kind`` and ``key``."""
    kind, key = event.stats.get(kind), event.stats.get(key)
    if isinstance(kind, int) and isinstance(key, int):
        return kind, key & ((1 << 64) - 1)  # an id may be written signed or unsigned
    return None


def _start(marker: StepMarker) -> int:
    return marker.start_ps


def _in_time_order(markers) -> list[StepMarker]:
    return sorted(markers, key=_start)
