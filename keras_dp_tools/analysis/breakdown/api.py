"""Per-step, per-replica breakdown of a profiler trace into compute, all-reduce and input:
the analysis' API (``analyze_window``, ``analyze_trace``, ``analyze_xspace``, ``Breakdown``).

For each marked step and each replica:

* ``compute_ms``: union of the replica's compute intervals;
* ``allreduce_ms``: union of its communication intervals (collectives and the copies of
  copy-based reductions), split into ``sync_wait_ms`` (inside a collective before the
  last peer of the same collective started: what better balance would save) and
  ``transfer_ms`` (the rest: what a faster interconnect would save);
* ``exposed_allreduce_ms`` (and its wait / transfer parts): communication not
  overlapped by the replica's compute;
* ``input_ms``: input waits not overlapped by compute or communication;
* ``other_ms``: the rest of the step (host overhead, launches, idle).

``compute_ms + exposed_allreduce_ms + input_ms + other_ms == step_ms`` exactly.
``comm_share`` is exposed transfer time over ``step_ms``, ``wait_share`` exposed wait.
Bandwidths follow nccl-tests (``bandwidth``), from the transfer time of all-reduce
collectives only (never from copies or gathers); a bus bandwidth above the link's
physical peak is not shown, and ``bandwidth_note`` says why a bandwidth is empty.

On GPU traces (``gpu_trace``) a step lasts from its marker's start to the end of the
last device event it launched, so late optimizer kernels count in their own step.

The stages: the trace is read into spans (``host_reading``, ``gpu_trace``, ``spans``;
CPU replicas attributed by ``replicas``), the step engine takes each (step, replica)'s
union lengths (``step_engine``), and ``rows`` builds the frames. Pure functions over a
parsed trace: no TensorFlow session, no training needed.
"""

from __future__ import annotations

import dataclasses
import os
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from keras_dp_tools.analysis.breakdown import gpu_trace
from keras_dp_tools.analysis.breakdown.device_roles import (
    gpu_device_name,
    host_device_names,
    no_devices_apart,
)
from keras_dp_tools.analysis.breakdown.host_reading import origin_ps, read_host
from keras_dp_tools.analysis.breakdown.marker_checks import (
    Untrue,
    capture_length_ps,
    summary,
    untrue_markers,
)
from keras_dp_tools.analysis.breakdown.memory import memory_release
from keras_dp_tools.analysis.breakdown.replicas import attribute_cpu_replicas, cpu_replica_count
from keras_dp_tools.analysis.breakdown.rows import replica_frame, step_rows
from keras_dp_tools.analysis.breakdown.spans import SpanColumns, Spans, sort_by_start
from keras_dp_tools.analysis.breakdown.unknown_facts import unknown_facts
from keras_dp_tools.analysis.trace.xevents import WireError
from keras_dp_tools.analysis.trace.xspace import StepMarker, gpu_planes, stream_xspace
from keras_dp_tools.records.columns import REPLICA_COLUMNS, XPROF_COLUMNS
from keras_dp_tools.records.facts import RunFacts

_UNTRUE = "not measured: "  # the bandwidth_note of a step whose marker cannot be true


@dataclass
class Breakdown:
    """The breakdown of one trace.

    Attributes:
        replicas: one row per step and replica (``REPLICA_COLUMNS``).
        steps: one row per step, times averaged over replicas (``STEP_COLUMNS``),
            plus XProf's own step numbers (``XPROF_COLUMNS``) where it has device data.
        source: the trace file, if read from one.
        attribution: None when every event's replica was read off what TF built;
            otherwise why some were not (their time then follows the op's copy number,
            which may name the wrong replica).
        unmeasured: None when every marked step was measured; otherwise which steps'
            markers cannot be true (``marker_checks``) and why. Their rows are kept
            with empty numbers and the reason in ``bandwidth_note``.
        step_source: where the steps came from (``step_sources.STEP_SOURCES``: our
            markers, tf_keras's or Keras 3's, XProf's step grouping, or the whole
            capture as one step); also each row's ``step_source``. None: the trace
            has no host events.
        devices_apart: the trace's devices that are not replicas (they ran none of
            the model's kernels: only copies, or nothing) and what they did
            (``device_roles.DEVICES_APART_COLUMNS``); found only when the run's
            devices are not given.
        unknown: the run's facts the trace cannot tell and nobody gave (gradient
            bytes, replicas in sync), and what their absence leaves out; None when
            all are known.
    """

    replicas: pd.DataFrame
    steps: pd.DataFrame
    source: str | None = None
    attribution: str | None = None
    unmeasured: str | None = None
    step_source: str | None = None
    devices_apart: pd.DataFrame = field(default_factory=no_devices_apart)
    unknown: str | None = None


def analyze_window(
    trace_path: str | os.PathLike,
    facts: RunFacts | None = None,
    *,
    link_peak_gbps: float | None = None,
    xprof: bool | None = None,
    release_memory: bool = False,
) -> Breakdown:
    """Breaks every marked step of one ``.xplane.pb`` file down per replica.

    Every time column is per step: a marker that covers k steps
    (``steps_per_execution``) has its times divided by k (column ``steps``).

    Args:
        trace_path: the ``.xplane.pb`` file (read a line at a time, never all at once).
        facts: what the analysis needs to know about the run beyond the trace
            (``RunFacts``: replicas, devices, bytes, steps per call); None: only what
            the trace says.
        link_peak_gbps: the interconnect's peak bandwidth per GPU and direction
            (``gpu_trace.LINK_PEAK_GBPS`` lists common ones); a bus bandwidth above it
            is not shown. GPU traces default to the fastest NVLink.
        xprof: add XProf's own per-step numbers (``XPROF_COLUMNS``, from its
            ``input_pipeline_analyzer``). None (default) does so for GPU traces only:
            on CPU-only traces XProf reports no device time.
        release_memory: hand the memory each stage frees back to the system as the
            analysis goes (glibc's ``malloc_trim``; no effect elsewhere), for a lower
            peak: 2.3-2.4x the file instead of 3.2x (1M synthetic events). For a
            process that does nothing else (the profiler's child analysis, the CLI);
            off by default, as trimming takes the heap's locks while other threads
            (training) allocate, and the pages they reuse fault back in.

    Returns:
        A ``Breakdown``. Its steps come from the first source the trace has
        (``step_sources``): our markers, tf_keras's or Keras 3's, XProf's step grouping
        of the executor's events, else the whole capture as one step
        (``Breakdown.step_source`` says which); empty frames only for a trace without
        host events.

    Raises:
        gpu_trace.UnusableTraceError: the replicas run on GPUs but a replica's GPU has
            no device events in the trace (the message says why).
    """
    facts = facts or RunFacts()
    space = stream_xspace(trace_path)
    if xprof is None:
        xprof = bool(gpu_planes(space))
    release = memory_release(release_memory)
    try:
        trace = _read_trace(space, facts, release)
    except WireError as error:  # events the streamed reader decodes itself
        raise ValueError(f"{trace_path} is not an XSpace profile ({error}).") from None
    del space
    breakdown = _break_down(trace, facts, link_peak_gbps, release)
    breakdown.source = str(trace_path)
    if xprof and not breakdown.steps.empty and trace.untrue:
        # XProf groups the steps by the same markers: seen here, an untrue one merged
        # two steps into one of XProf's, which then paired with the wrong step of ours.
        breakdown.steps = breakdown.steps.assign(**dict.fromkeys(XPROF_COLUMNS, np.nan))
        breakdown.unmeasured += "; XProf's step numbers left out (it finds steps by the markers)"
    elif xprof and not breakdown.steps.empty:
        from keras_dp_tools.analysis.breakdown.xprof_steps import align_steps, xprof_step_table

        xprof_steps = align_steps(xprof_step_table(Path(trace_path)), breakdown.steps["step"])
        breakdown.steps = breakdown.steps.merge(xprof_steps, on="step", how="left")
    return breakdown


def analyze_trace(
    path: str | os.PathLike,
    *,
    link_peak_gbps: float | None = None,
    xprof: bool | None = None,
    release_memory: bool = False,
    **facts,
) -> Breakdown:
    """``analyze_window`` with the run's facts as keywords.

    Args:
        facts: the ``RunFacts`` by name (``allreduce_bytes``, ``local_replicas``,
            ``replicas_in_sync``, ``devices``, ``sparse_bytes``, ``gather_bytes``,
            ``steps_covered``, ...).
        Others: see ``analyze_window``.

    Raises:
        TypeError: a keyword that names no fact (the message names it).
    """
    run = _keyword_facts(facts)
    return analyze_window(
        path, run, link_peak_gbps=link_peak_gbps, xprof=xprof, release_memory=release_memory
    )


def analyze_xspace(
    space, *, link_peak_gbps: float | None = None, release_memory: bool = False, **facts
) -> Breakdown:
    """``analyze_window`` on an XSpace already parsed (``xspace.load_xspace``), with the
    run's facts as keywords (as ``analyze_trace``); without XProf's columns."""
    run = _keyword_facts(facts)
    release = memory_release(release_memory)
    return _break_down(_read_trace(space, run, release), run, link_peak_gbps, release)


def _keyword_facts(keywords: Mapping) -> RunFacts:
    """The ``RunFacts`` that the keywords of ``analyze_trace`` and ``analyze_xspace`` name.

    Raises:
        TypeError: a keyword that is no fact of ``RunFacts`` (named in the message, with
            the facts there are).
    """
    known = {fact.name for fact in dataclasses.fields(RunFacts)}
    unknown = sorted(set(keywords) - known)
    if unknown:
        raise TypeError(
            f"no run fact is called {', '.join(map(repr, unknown))}; the facts are "
            f"{', '.join(sorted(known))} (RunFacts)"
        )
    return RunFacts(**keywords)


@dataclass
class _Trace:
    """What the breakdown takes from a trace (the parsed XSpace can go once it is read).
    ``untrue``: why each marker that cannot be true is not, by index in ``markers``;
    those markers are held with no length (they take no spans; their rows stay empty).
    ``unchecked``: why the capture rule was not applied, where it would have mattered."""

    markers: list[StepMarker]
    spans: Spans
    replica_count: int
    attribution: str | None
    on_gpu: bool
    untrue: dict[int, Untrue] = field(default_factory=dict)
    unchecked: str | None = None
    step_source: str | None = None
    device_names: list[str] = field(default_factory=list)
    devices_apart: pd.DataFrame = field(default_factory=no_devices_apart)

    def take_spans(self) -> Spans:
        """The spans, no longer held here: the breakdown frees them (the largest part
        of its memory) as soon as it has the steps' lengths, before building rows."""
        spans, self.spans = self.spans, None
        return spans


def _read_trace(space, facts: RunFacts, release_memory: Callable[[], None]) -> _Trace:
    devices = facts.devices
    columns = SpanColumns(origin_ps(space))
    # The strategy's devices choose the path; a CPU strategy ignores GPU planes.
    gpus = gpu_trace.read_replica_gpus(space, devices, columns.origin_ps)
    steps, launches, extent = read_host(space, devices, columns, inputs_only=gpus is not None)
    markers = steps.markers
    untrue, unchecked = untrue_markers(markers, extent, capture_length_ps(space))
    if gpus is not None:
        # Linked by the markers as written: a launch inside an untrue marker goes to it
        # (and its row stays empty), not to another step.
        _add_gpu_spans(gpus, columns, launches, markers, steps.source == "group_id")
        replica_count = facts.local_replicas or len(gpus.ordinals)
        names = [gpu_device_name(ordinal) for ordinal in gpus.ordinals]
        apart = gpus.apart
        del gpus  # the spans hold the events now
        spans = columns.build(release_memory)
        sort_by_start(spans, release_memory)
        markers = _without_length(markers, untrue)
        return _Trace(
            markers, spans, replica_count, None, True, untrue, unchecked, steps.source, names, apart
        )
    spans = columns.build(release_memory)
    replica_count = facts.local_replicas or cpu_replica_count(spans)
    spans, attribution = attribute_cpu_replicas(spans, replica_count)  # in trace order
    sort_by_start(spans, release_memory)
    markers = _without_length(markers, untrue)
    names = host_device_names(space, replica_count)
    return _Trace(
        markers, spans, replica_count, attribution, False, untrue, unchecked, steps.source, names
    )


def _add_gpu_spans(
    gpus: gpu_trace.ReplicaGpus, columns: SpanColumns, launches, markers, by_group: bool
):
    """Adds each replica's device events as arrays, each linked by its correlation id
    to the marker that enclosed its host launch; where the steps are XProf's groups
    written with the capture (``by_group``), an event without that link goes to the
    step of its own ``group_id`` (such captures may hold no host launches at all)."""
    links = gpu_trace.launch_links(launches, markers, columns.origin_ps)
    for replica, events in enumerate(gpus.events):
        launched = gpu_trace.launching_markers(events.correlation, links)
        if by_group:
            grouped = gpu_trace.grouped_markers(events.group, markers)
            launched = np.where(launched >= 0, launched, grouped)
        columns.extend(
            events.kind,
            np.full(len(events.kind), replica, dtype=np.int16),
            events.start,
            events.end,
            launched=launched,
            reducing=events.reducing,
        )


def _without_length(markers: list[StepMarker], untrue: Mapping[int, Untrue]) -> list[StepMarker]:
    """The markers, those in ``untrue`` ending where they start: they take no time and
    no spans from the steps beside them."""
    return [
        replace(marker, end_ps=marker.start_ps) if index in untrue else marker
        for index, marker in enumerate(markers)
    ]


def _break_down(
    trace: _Trace,
    facts: RunFacts,
    link_peak_gbps: float | None,
    release_memory: Callable[[], None],
) -> Breakdown:
    """The breakdown of a trace already read."""
    if trace.on_gpu:
        link_peak_gbps = link_peak_gbps or gpu_trace.DEFAULT_GPU_PEAK_GBPS
    notes = {index: f"{_UNTRUE}{why.note}" for index, why in sorted(trace.untrue.items())}
    step_notes: dict[int, str] = {}  # by step number: its first untrue marker's note
    for index, note in notes.items():
        step_notes.setdefault(trace.markers[index].step, note)
    replicas = replica_frame(
        trace.markers,
        trace.take_spans(),
        trace.replica_count,
        facts,
        link_peak_gbps,
        release_memory,
        notes,
        None if facts.devices else trace.device_names,
        trace.step_source,
    )
    ranks = facts.ranks(trace.replica_count)
    steps = step_rows(replicas, facts, ranks, link_peak_gbps, step_notes)
    # One line per rule, not per step: a window of untrue steps gives a short reason.
    steps_by_rule: dict[str, list[int]] = defaultdict(list)
    for index, why in sorted(trace.untrue.items()):
        steps_by_rule[why.rule].append(trace.markers[index].step)
    reasons = [summary(steps_by_rule) if steps_by_rule else None, trace.unchecked]
    return Breakdown(
        replicas[REPLICA_COLUMNS],
        steps,
        attribution=trace.attribution,
        unmeasured="; ".join(filter(None, reasons)) or None,
        step_source=trace.step_source,
        devices_apart=trace.devices_apart,
        unknown=unknown_facts(facts, trace.replica_count, trace.on_gpu) if trace.markers else None,
    )
