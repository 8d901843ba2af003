"""Per-step, per-replica breakdown of a profiler trace into compute, all-reduce and input.

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
Bandwidths follow nccl-tests: ``algbw = bytes / transfer``, ``busbw = algbw * 2(n-1)/n``,
from the transfer time of all-reduce collectives only (never from copies or gathers); a
bus bandwidth above the link's physical peak is not shown, and ``bandwidth_note`` says
why a bandwidth is empty.

On GPU traces (``gpu_trace``) a step lasts from its marker's start to the end of the
last device event it launched, so late optimizer kernels count in their own step.

Pure functions over a parsed trace: no TensorFlow session, no training needed.
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from keras_dp_tools.analysis import gpu_trace, intervals
from keras_dp_tools.analysis.classify import (
    PEER_KINDS,
    PER_REPLICA_COPY_TYPES,
    Kind,
    classify_host_name,
    copy_number,
    receiving_device,
    scoped_replica,
)
from keras_dp_tools.analysis.replicas import packed_replica, peer_replicas
from keras_dp_tools.analysis.xspace import (
    STEP_EVENT_NAME,
    StepMarker,
    TraceEvent,
    _stats,
    gpu_planes,
    host_planes,
    load_xspace,
    step_markers,
)
from keras_dp_tools.schema import MEAN_COLUMNS, REPLICA_COLUMNS, STEP_COLUMNS

# The columns (keras_dp_tools.schema): MEAN_COLUMNS are the per-replica times (per
# step) the step row averages over replicas.
_MEAN_COLUMNS = MEAN_COLUMNS
_BYTES_COLUMNS = ["allreduce_bytes", "gather_bytes", "row_bytes"]
_BANDWIDTHS = ["algbw_gbps", "busbw_gbps", "gather_busbw_gbps"]  # NaN where not shown
# All-reduce time alone and its transfer part: what the all-reduce bandwidth divides by.
_BANDWIDTH_TIMES = ["reduce_ms", "reduce_transfer_ms"]
# nccl-tests' bus bandwidth factors: busbw = algbw * factor(ranks).
_BUS_FACTORS = {
    "allreduce": lambda ranks: 2 * (ranks - 1) / ranks,
    "allgather": lambda ranks: (ranks - 1) / ranks,
}


@dataclass(frozen=True, slots=True)
class _Span:
    kind: Kind
    replica: int | None  # None: shared by all replicas (e.g. one input pipeline)
    start_ps: int
    end_ps: int
    peer_key: object = None  # collectives with one key are the same operation on peers
    name: str = ""  # the op's name on CPU traces: its copy number tells the replica
    # GPU: (step, marker start) of the marker that launched it; None: by time.
    launched_in: tuple[int, int] | None = None
    collective: str | None = None  # NCCL's operation (all_reduce, all_gather, ...)


@dataclass(frozen=True)
class RunFacts:
    """What the analysis needs to know about the run beyond the trace.

    Attributes:
        allreduce_bytes: bytes of all trainable variables: what each replica
            all-reduces per step when every gradient is dense.
        sparse_bytes: bytes of the variables whose gradients are sparse (embedding
            tables). TF 2.21 all-gathers those instead, so in a step with gathers the
            all-reduce moves ``allreduce_bytes - sparse_bytes``.
        gather_bytes: bytes one step all-gathers (every replica's rows: values and
            indices), the size nccl-tests calls S for an all-gather.
        steps_covered: steps each marked call ran, by its first step (more than one
            under ``steps_per_execution``); steps not listed count the iterations the
            trace's collectives carry (``iter_id``), else 1.
        group_size: ranks taking part in each collective, for the bus bandwidth.
    """

    allreduce_bytes: int | None = None
    sparse_bytes: int | None = None
    gather_bytes: int | None = None
    steps_covered: Mapping[int, int] = field(default_factory=dict)
    group_size: int = 1


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
    """

    replicas: pd.DataFrame
    steps: pd.DataFrame
    source: str | None = None
    attribution: str | None = None


def _peer_key(stats) -> tuple | None:
    """What identifies one collective across replicas. Seen in TF 2.21 captures: the k
    all-reduces of a ``steps_per_execution=k`` call share ``instance_key``, ``group_key``,
    ``step_id`` and ``frame_id`` and differ only in ``iter_id`` (0..k-1)."""
    if stats.get("instance_key") is None:
        return None
    return tuple(
        stats.get(name) for name in ("group_key", "instance_key", "step_id", "frame_id", "iter_id")
    )


# Kinds as small integers, for the span columns.
_KINDS = list(Kind)
_CODE = {kind: code for code, kind in enumerate(_KINDS)}
_NO_REPLICA = -1  # a span shared by all replicas
_MARKER, _LAUNCH = "marker", "launch"  # host events read for their stats, not as spans


@dataclass
class _Spans:
    """The spans of a trace as columns (one entry per span, in trace order).

    Times are picoseconds from ``origin_ps`` (absolute picoseconds overflow int64).
    Only the few spans whose replica the op's copies decide carry a ``name``, and only
    collectives a ``peer_key`` (both by position).
    """

    origin_ps: int
    kind: np.ndarray
    replica: np.ndarray  # _NO_REPLICA: shared by all replicas
    start: np.ndarray
    end: np.ndarray
    launched: np.ndarray  # GPU: index of the marker that launched it; -1: by time
    reducing: np.ndarray  # counts towards the all-reduce bandwidth (not another NCCL op)
    keys: dict[int, tuple] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)


class _SpanColumns:
    """Collects spans row by row into plain lists, then into ``_Spans``. The columns
    most spans leave at their default (launch link, bandwidth use) are kept sparse."""

    def __init__(self, origin_ps: int):
        self.origin_ps = origin_ps
        self.kind, self.replica, self.start, self.end = [], [], [], []
        self.launched: dict[int, int] = {}
        self.not_reducing: list[int] = []
        self.keys, self.names = {}, {}

    def add(self, kind, replica, start, end, launched=-1, reducing=True, key=None, name=""):
        position = len(self.kind)
        if key is not None:
            self.keys[position] = key
        if name:
            self.names[position] = name
        if launched >= 0:
            self.launched[position] = launched
        if not reducing:
            self.not_reducing.append(position)
        self.kind.append(kind)
        self.replica.append(_NO_REPLICA if replica is None else replica)
        self.start.append(start)
        self.end.append(end)

    def build(self) -> _Spans:
        count = len(self.kind)
        launched = np.full(count, -1, dtype=np.int64)
        launched[np.fromiter(self.launched, np.int64)] = np.fromiter(
            self.launched.values(), np.int64
        )
        reducing = np.ones(count, dtype=bool)
        reducing[self.not_reducing] = False
        return _Spans(
            self.origin_ps,
            np.array(self.kind, dtype=np.int8),
            np.array(self.replica, dtype=np.int64),
            np.array(self.start, dtype=np.int64),
            np.array(self.end, dtype=np.int64),
            launched,
            reducing,
            self.keys,
            self.names,
        )


def _origin_ps(space) -> int:
    """A time near the trace's events, so relative picoseconds fit int64."""
    for plane in space.planes:
        for line in plane.lines:
            return line.timestamp_ns * 1000
    return 0


def _host_metadata(name: str, inputs_only: bool):
    """What the engine does with host events of this name, decided once per event
    metadata: None (skip), (_MARKER | _LAUNCH,) or (kind, replica, needs_stats, copied)."""
    if name == STEP_EVENT_NAME:
        return (_MARKER,)
    if gpu_trace.is_cuda_api_call(name):
        return (_LAUNCH,)
    classified = classify_host_name(name)
    if classified is None or (inputs_only and classified[0] is not Kind.INPUT):
        return None
    kind, replica = classified
    if inputs_only:
        return _CODE[kind], replica, False, False
    receiver = kind is Kind.COPY and replica is not None and scoped_replica(name) is None
    copied = kind in PEER_KINDS or _op_type(name) in PER_REPLICA_COPY_TYPES
    return _CODE[kind], replica, receiver or kind in PEER_KINDS, copied


def _read_host(space, devices, columns: _SpanColumns, inputs_only: bool):
    """One pass over the host planes: the spans of classified events (into ``columns``;
    only input waits if ``inputs_only``), and the step markers and CUDA launches as
    ``TraceEvent`` (few events). Events are classified by their metadata, once; only
    the events whose stats matter (collectives, markers, launches) have them read."""
    markers, launches = [], []
    origin = columns.origin_ps
    kinds, replicas, starts, ends = columns.kind, columns.replica, columns.start, columns.end
    names = columns.names
    for plane in host_planes(space):
        stat_names = {key: meta.name for key, meta in plane.stat_metadata.items()}
        plain, special = {}, {}  # by metadata id: spans without and with stats to read
        for key, meta in plane.event_metadata.items():
            role = _host_metadata(meta.name, inputs_only)
            if role is None:
                continue
            if len(role) == 4 and not role[2]:
                replica = _NO_REPLICA if role[1] is None else role[1]
                plain[key] = (role[0], replica, meta.name if role[3] else "")
            else:
                special[key] = (role, meta.name, _stats(meta.stats, stat_names))
        plain_role, special_role = plain.get, special.get
        for line in plane.lines:
            line_name = line.display_name or line.name
            off_python = line_name != "python"  # eager ops and tracing: host overhead
            base = line.timestamp_ns * 1000 - origin
            for event in line.events:
                entry = plain_role(event.metadata_id)
                if entry is not None:  # the common case, kept lean
                    if off_python:
                        if entry[2]:
                            names[len(kinds)] = entry[2]
                        start = base + event.offset_ps
                        kinds.append(entry[0])
                        replicas.append(entry[1])
                        starts.append(start)
                        ends.append(start + event.duration_ps)
                    continue
                entry = special_role(event.metadata_id)
                if entry is None:
                    continue
                role, name, meta_stats = entry
                if len(role) == 4 and not off_python:
                    continue
                stats = meta_stats
                if event.stats:
                    stats = {**meta_stats, **_stats(event.stats, stat_names)}
                start = base + origin + event.offset_ps
                end = start + event.duration_ps
                traced = TraceEvent(plane.name, line_name, name, start, end, stats)
                if role[0] == _MARKER:
                    markers.append(traced)
                elif role[0] == _LAUNCH:
                    launches.append(traced)
                else:
                    _add_host_span(columns, role, traced, devices)
    return step_markers(markers), launches


def _add_host_span(columns: _SpanColumns, role, event: TraceEvent, devices) -> None:
    kind_code, replica, _, copied = role
    kind = _KINDS[kind_code]
    if kind is Kind.COPY and replica is not None and scoped_replica(event.name) is None:
        # An unscoped transfer (e.g. feeding replica 3's collective from /cpu:0) serves
        # the replica that receives it.
        replica = _device_replica(receiving_device(event), devices, replica)
    key = _peer_key(event.stats) if kind in PEER_KINDS else None
    start, end = event.start_ps - columns.origin_ps, event.end_ps - columns.origin_ps
    columns.add(kind_code, replica, start, end, key=key, name=event.name if copied else "")


def _attribute_cpu_replicas(spans: _Spans, replica_count: int) -> tuple[_Spans, str | None]:
    """Gives the per-replica copies of collectives and packing ops their replica (see
    ``keras_dp_tools.analysis.replicas``); returns the spans and why some could not be
    attributed (None if all could)."""
    peers: dict[object, list[int]] = defaultdict(list)
    for position, key in spans.keys.items():
        peers[key].append(position)
    replica_of: dict[int, int] = {}
    reasons = []
    for positions in peers.values():
        names = [spans.names[p].rsplit(":", 1)[0] for p in positions]
        if all(scoped_replica(name) is not None for name in names):
            continue  # replica scopes say it
        replicas, reason = peer_replicas(names, replica_count)
        if replicas is None:
            reasons.append(reason)
            continue
        replica_of.update(zip(positions, replicas, strict=True))
    copies: dict[str, set[int]] = defaultdict(set)
    unkeyed = {p: name for p, name in spans.names.items() if p not in spans.keys}
    for name in unkeyed.values():
        base, number = copy_number(name)
        copies[base].add(number)
    for position, name in unkeyed.items():
        if position in replica_of or scoped_replica(name) is not None:
            continue
        base, number = copy_number(name)
        replica = packed_replica(number, copies[base], replica_count)
        if replica is None and len(copies[base]) == 1:
            replica = 0  # one unscoped copy: replica 0's op
        elif replica is None:
            reasons.append(f"{len(copies[base])} copies of {base} for {replica_count} replicas")
        if replica is not None:
            replica_of[position] = replica
    resolved = spans.replica.copy()
    beyond = resolved >= replica_count  # a guess, for spans the copies do not place
    resolved[beyond] %= replica_count
    if replica_of:
        resolved[np.fromiter(replica_of, np.int64)] = np.fromiter(replica_of.values(), np.int64)
    reason = "; ".join(sorted(set(reasons))) or None
    return replace(spans, replica=resolved), reason


def _device_replica(device: str | None, devices: Sequence[str] | None, default: int) -> int:
    """The replica of a device (``/job:../device:CPU:3``): its position among
    ``devices``, else the device's ordinal."""
    if device is None:
        return default
    short = device.rsplit("device:", 1)[-1].lower()  # "cpu:3"
    for replica, name in enumerate(devices or ()):
        if name.lower().endswith(short) and (name == device or "/job:" not in name):
            return replica
    ordinal = short.rsplit(":", 1)[-1]
    return int(ordinal) if ordinal.isdigit() else default


def _op_type(name: str) -> str:
    return name.rpartition(":")[2]


def _add_gpu_spans(space, ordinals: Sequence[int], columns: _SpanColumns, launches, markers):
    marker_index = {(marker.step, marker.start_ps): i for i, marker in enumerate(markers)}
    origin = columns.origin_ps
    for s in gpu_trace.device_spans(space, ordinals, gpu_trace.launch_markers(launches, markers)):
        launched = -1 if s.launched_in is None else marker_index[s.launched_in]
        reducing = s.collective in (None, "all_reduce")
        columns.add(
            _CODE[s.kind], s.replica, s.start_ps - origin, s.end_ps - origin, launched, reducing
        )


def _sync_waits(collectives: list[_Span]) -> dict[int, list[intervals.Interval]]:
    """Per replica, the time spent in collectives before the last peer arrived.

    Peers share an ``instance_key``; without one (NCCL kernels) the i-th collective of
    each replica in a step is the same operation, as NCCL requires the same order on
    every rank.
    """
    by_replica: dict[int | None, list[_Span]] = defaultdict(list)
    for span in sorted(collectives, key=lambda span: span.start_ps):
        by_replica[span.replica].append(span)
    keyed: dict[object, list[_Span]] = defaultdict(list)
    for spans in by_replica.values():
        for ordinal, span in enumerate(spans):
            key = ("instance", span.peer_key) if span.peer_key is not None else ("nth", ordinal)
            keyed[key].append(span)
    waits: dict[int, list[intervals.Interval]] = defaultdict(list)
    for peers in keyed.values():
        if len(peers) < 2:
            continue
        last_arrival = max(span.start_ps for span in peers)
        for span in peers:
            if span.start_ps < last_arrival:
                waits[span.replica].append((span.start_ps, min(last_arrival, span.end_ps)))
    return waits


def _bandwidths(nbytes, transfer_ms, ranks, collective="allreduce"):
    """nccl-tests' (algbw, busbw) in GB/s for ``nbytes`` moved in ``transfer_ms``."""
    if not nbytes or not transfer_ms or transfer_ms <= 0 or not ranks:
        return None, None
    algbw = nbytes / (transfer_ms / 1e3) / 1e9
    return algbw, algbw * _BUS_FACTORS[collective](ranks)


def _missing_bandwidth(bytes_known: bool, ranks, reduce_transfer_ms) -> str | None:
    """Why a row has no all-reduce bandwidth, or None if it has one."""
    if not ranks or ranks <= 1:
        return "one replica: nothing to all-reduce"
    if not bytes_known:
        return "all-reduce bytes unknown (pass allreduce_bytes)"
    if not reduce_transfer_ms or reduce_transfer_ms <= 0:
        return "no all-reduce collective ran in this step"
    return None


class _StepIndex:
    """Finds each marker's spans without scanning them all: spans launched by a marker
    are grouped by marker; the others are sorted by start, with the running maximum of
    their ends, so two binary searches bound the candidates of a time window."""

    def __init__(self, spans: _Spans):
        order = np.argsort(spans.launched, kind="stable")
        launched = spans.launched[order]
        first = np.searchsorted(launched, 0)
        self.unlinked = order[:first]
        bounds = np.flatnonzero(np.diff(launched[first:])) + 1
        self.by_marker = {
            int(group[0]): order[first:][start:stop]
            for start, stop, group in (
                (a, b, launched[first:][a:b])
                for a, b in zip(
                    [0, *bounds.tolist()], [*bounds.tolist(), len(launched) - first], strict=True
                )
            )
            if len(group)
        }
        by_start = np.argsort(spans.start[self.unlinked], kind="stable")
        self.unlinked = self.unlinked[by_start]
        self.unlinked_starts = spans.start[self.unlinked]
        self.reached = (
            np.maximum.accumulate(spans.end[self.unlinked]) if len(by_start) else by_start
        )

    def window(self, spans: _Spans, start: int, end: int) -> np.ndarray:
        """Positions (in trace order) of unlinked spans overlapping ``(start, end)``."""
        low = np.searchsorted(self.reached, start, side="right")
        high = np.searchsorted(self.unlinked_starts, end, side="left")
        candidates = self.unlinked[low:high]
        return np.sort(candidates[spans.end[candidates] > start])


def _step_spans(index: int, marker: StepMarker, spans: _Spans, steps: _StepIndex):
    """The spans of a step (positions, clipped starts and ends) and the step's end. A
    device event launched inside the marker belongs to it whenever it ran; the step then
    lasts until its last launched event ends. Events without that link count by time
    within the marker."""
    start, marker_end = marker.start_ps - spans.origin_ps, marker.end_ps - spans.origin_ps
    launched = steps.by_marker.get(index, np.empty(0, np.int64))
    end = max(marker_end, int(spans.end[launched].max())) if len(launched) else marker_end
    by_time = steps.window(spans, start, marker_end)
    positions = np.concatenate([launched, by_time])
    stops = np.concatenate(
        [np.full(len(launched), end, np.int64), np.full(len(by_time), marker_end, np.int64)]
    )
    starts = np.maximum(spans.start[positions], start)
    ends = np.minimum(spans.end[positions], stops)
    return positions, starts, ends, start, end


def _peer_spans(kind: Kind, spans: _Spans, positions, starts, ends) -> list[_Span]:
    """The step's collectives of one kind, in step order, as ``_Span`` for ``_sync_waits``."""
    chosen = np.flatnonzero(spans.kind[positions] == _CODE[kind])
    return [
        _Span(
            kind,
            None if replica == _NO_REPLICA else replica,
            span_start,
            span_end,
            spans.keys.get(position),
        )
        for position, replica, span_start, span_end in zip(
            positions[chosen].tolist(),
            spans.replica[positions[chosen]].tolist(),
            starts[chosen].tolist(),
            ends[chosen].tolist(),
            strict=True,
        )
    ]


def _iterations(keys: list) -> int:
    """Steps of one call as its collectives count them (distinct ``iter_id``)."""
    iterations = {key[-1] for key in keys if isinstance(key, tuple)}
    return len(iterations - {None}) or 1


def _replica_rows(
    index: int,
    marker: StepMarker,
    spans: _Spans,
    steps_index: _StepIndex,
    replica_ids,
    devices,
    facts: RunFacts,
    peak_gbps: float | None = None,
):
    positions, starts, ends, start, end = _step_spans(index, marker, spans, steps_index)
    collectives = _peer_spans(Kind.COLLECTIVE, spans, positions, starts, ends)
    gathers = _peer_spans(Kind.GATHER, spans, positions, starts, ends)
    steps = facts.steps_covered.get(marker.step) or _iterations(
        [span.peer_key for span in (*collectives, *gathers)]
    )
    waits = _sync_waits(collectives)
    for replica, parts in _sync_waits(gathers).items():
        waits[replica] += parts
    # Time any replica runs anything, and the host's time around the train function:
    # every replica's busy time lies inside it, so what is left of the step before the
    # first and after the last span is dispatch, and gaps between spans are idle.
    ran = ends > starts
    if ran.any():
        first, last = int(starts[ran].min()), int(ends[ran].max())
        idle_here = last - first - intervals.union_length(starts, ends)
    else:
        first = last = end
        idle_here = 0
    dispatch = (first - start) + (end - last)
    has_gathers = bool(gathers)
    reduce_bytes = facts.allreduce_bytes
    if has_gathers and reduce_bytes and facts.sparse_bytes:
        reduce_bytes -= facts.sparse_bytes
    ranks = facts.group_size
    to_ms = 1e-9 / steps  # picoseconds of the call to milliseconds per step
    kinds = spans.kind[positions]
    owners = spans.replica[positions]
    reducing = spans.reducing[positions]
    compute_kind = kinds == _CODE[Kind.COMPUTE]
    reduce_kind = (kinds == _CODE[Kind.COLLECTIVE]) | (kinds == _CODE[Kind.COPY])
    gather_kind = kinds == _CODE[Kind.GATHER]
    input_kind = kinds == _CODE[Kind.INPUT]
    reducing_kind = (kinds == _CODE[Kind.COLLECTIVE]) & reducing
    if not ranks or ranks <= 1:
        # One rank has nothing to exchange: its sends (the step's results going back to
        # the host, seen with OneDeviceStrategy off /cpu:0) are not communication.
        reduce_kind = gather_kind = reducing_kind = np.zeros_like(compute_kind)
    rows = []
    for replica in replica_ids:
        mine = (owners == replica) | (owners == _NO_REPLICA)
        wait = np.array(waits.get(replica, []), dtype=np.int64).reshape(-1, 2)

        def covered(*masks, wait_too=False, mine=mine, wait=wait):
            """Length of the union of the spans of ``masks`` (and the waits)."""
            chosen = mine & np.logical_or.reduce(masks) if masks else np.zeros_like(mine)
            if wait_too:
                return intervals.union_length(
                    np.concatenate([starts[chosen], wait[:, 0]]),
                    np.concatenate([ends[chosen], wait[:, 1]]),
                )
            return intervals.union_length(starts[chosen], ends[chosen])

        compute = covered(compute_kind)
        comm = covered(reduce_kind, gather_kind)
        gather = covered(gather_kind)
        wait_length = covered(wait_too=True)
        busy = covered(compute_kind, reduce_kind, gather_kind)
        busy_or_input = covered(compute_kind, reduce_kind, gather_kind, input_kind)
        # Set algebra on lengths: |A - B| = |A + B| - |B|, |A & B| = |A| + |B| - |A + B|.
        exposed_comm = busy - compute
        exposed_wait = covered(compute_kind, wait_too=True) - compute
        transfer = comm - wait_length
        other = (end - start) - busy_or_input
        reduce_transfer = covered(reducing_kind, wait_too=True) - wait_length
        row = {
            "step": marker.step,
            "replica": replica,
            "device": devices[replica] if devices and replica < len(devices) else None,
            "steps": steps,
            "step_ms": (end - start) * to_ms,
            "compute_ms": compute * to_ms,
            "allreduce_ms": comm * to_ms,
            "sync_wait_ms": wait_length * to_ms,
            "transfer_ms": transfer * to_ms,
            "gather_ms": gather * to_ms,
            "gather_transfer_ms": (covered(gather_kind, wait_too=True) - wait_length) * to_ms,
            "exposed_allreduce_ms": exposed_comm * to_ms,
            "exposed_sync_wait_ms": exposed_wait * to_ms,
            "exposed_transfer_ms": (exposed_comm - exposed_wait) * to_ms,
            "input_ms": (busy_or_input - busy) * to_ms,
            "other_ms": other * to_ms,
            "dispatch_ms": dispatch * to_ms,
            "idle_ms": idle_here * to_ms,
            "scheduling_ms": (other - dispatch - idle_here) * to_ms,
        }
        step_ms = row["step_ms"]
        row["comm_share"] = row["exposed_transfer_ms"] / step_ms if step_ms else None
        row["wait_share"] = row["exposed_sync_wait_ms"] / step_ms if step_ms else None
        row["reduce_transfer_ms"] = reduce_transfer * to_ms  # not a column: for bandwidth
        row["reduce_ms"] = covered(reduce_kind) * to_ms
        row.update(_bytes_and_bandwidths(row, reduce_bytes, facts.gather_bytes, ranks, peak_gbps))
        rows.append(row)
    return rows


def _bytes_and_bandwidths(
    row, reduce_bytes, gather_bytes, ranks, peak_gbps=None, *, bytes_known=None
) -> dict:
    """Per-step bytes of the row's all-reduce and all-gather (None where it has none, or
    with one rank), the row's total, and each one's bandwidth from its own bytes and
    transfer time; a bandwidth above ``peak_gbps`` is left out and ``bandwidth_note``
    says why the all-reduce bandwidth is empty."""
    multi = ranks and ranks > 1
    bytes_known = bool(reduce_bytes) if bytes_known is None else bytes_known
    reduce_bytes = reduce_bytes if multi and row["reduce_ms"] > 0 else None
    gather_bytes = gather_bytes if multi and row["gather_ms"] > 0 else None
    total = (reduce_bytes or 0) + (gather_bytes or 0)
    algbw, busbw = _bandwidths(reduce_bytes, row["reduce_transfer_ms"], ranks)
    note = gpu_trace.check_bandwidth(busbw, peak_gbps)
    if note is not None:
        algbw = busbw = None
    elif busbw is None:
        note = _missing_bandwidth(bytes_known, ranks, row["reduce_transfer_ms"])
    gather_busbw = _bandwidths(gather_bytes, row["gather_transfer_ms"], ranks, "allgather")[1]
    if gpu_trace.check_bandwidth(gather_busbw, peak_gbps) is not None:
        gather_busbw = None
    return {
        "allreduce_bytes": reduce_bytes,
        "gather_bytes": gather_bytes,
        "row_bytes": total * int(row["steps"]) or None,
        "algbw_gbps": algbw,
        "busbw_gbps": busbw,
        "gather_busbw_gbps": gather_busbw,
        "bandwidth_note": note,
    }


def _step_rows(
    replica_frame: pd.DataFrame, facts: RunFacts, peak_gbps: float | None = None
) -> pd.DataFrame:
    if replica_frame.empty:
        return pd.DataFrame(columns=STEP_COLUMNS)
    grouped = replica_frame.groupby("step", sort=True)
    steps = grouped[[*_MEAN_COLUMNS, *_BANDWIDTH_TIMES]].mean()
    steps.insert(0, "step_ms", grouped["step_ms"].first())
    steps.insert(0, "steps", grouped["steps"].first())
    steps.insert(0, "replicas", grouped["replica"].nunique())
    steps["max_sync_wait_ms"] = grouped["sync_wait_ms"].max()
    # The replica the others waited for arrived last, so it waited least itself.
    straggler = replica_frame.loc[grouped["sync_wait_ms"].idxmin(), ["step", "replica"]]
    steps["straggler_replica"] = straggler.set_index("step")["replica"].where(
        steps["max_sync_wait_ms"] > 0
    )
    # The step's bandwidth: its bytes over the replicas' mean all-reduce transfer time.
    byte_rows = [
        _bytes_and_bandwidths(
            row,
            None if pd.isna(reduce_bytes) else reduce_bytes,
            None if pd.isna(gather_bytes) else gather_bytes,
            facts.group_size,
            peak_gbps,
            bytes_known=bool(facts.allreduce_bytes),
        )
        for row, reduce_bytes, gather_bytes in zip(
            steps.reset_index().to_dict("records"),
            grouped["allreduce_bytes"].max(),
            grouped["gather_bytes"].max(),
            strict=True,
        )
    ]
    for column, values in pd.DataFrame(byte_rows, index=steps.index).items():
        steps[column] = values
    steps = steps.astype(dict.fromkeys(_BANDWIDTHS, float))
    steps["straggler_replica"] = steps["straggler_replica"].astype("Int64")
    return steps.reset_index()[STEP_COLUMNS]


def analyze_xspace(
    space,
    *,
    allreduce_bytes: int | None = None,
    replicas: int | None = None,
    devices: Sequence[str] | None = None,
    group_size: int | None = None,
    sparse_bytes: int | None = None,
    gather_bytes: int | None = None,
    steps_covered: Mapping[int, int] | None = None,
    link_peak_gbps: float | None = None,
) -> Breakdown:
    """Breaks every marked step of a parsed XSpace down per replica.

    Every time column is per step: a marker that covers k steps
    (``steps_per_execution``) has its times divided by k (column ``steps``).

    Args:
        space: an ``XSpace`` proto (see ``load_xspace``).
        allreduce_bytes: bytes of the trainable variables, what each replica
            all-reduces per step when all gradients are dense; None leaves the
            bandwidth columns empty.
        replicas: replicas in this trace (this worker's, under a multi-worker
            strategy); by default, those seen in the trace (GPU planes, or
            ``replica_k`` scopes and collective copies on CPU).
        devices: device names of the replicas in order, to label the rows; on GPU
            traces, their ordinals choose the planes (``/gpu:2`` is ``/device:GPU:2``).
        group_size: ranks taking part in each all-reduce (``num_replicas_in_sync``),
            for the bus bandwidth; by default ``replicas``. Under a multi-worker
            strategy the peers in other processes are not in this trace, so the sync
            wait only covers this worker's replicas.
        sparse_bytes, gather_bytes, steps_covered: see ``RunFacts``.
        link_peak_gbps: the interconnect's peak bandwidth per GPU and direction
            (``gpu_trace.LINK_PEAK_GBPS`` lists common ones); a bus bandwidth above it
            is not shown. GPU traces default to the fastest NVLink.

    Returns:
        A ``Breakdown``; empty frames if the trace has no step markers.

    Raises:
        gpu_trace.UnusableTraceError: the replicas run on GPUs but a replica's GPU has
            no device events in the trace (the message says why).
    """
    origin = _origin_ps(space)
    columns = _SpanColumns(origin)
    # The strategy's devices choose the path; a CPU strategy ignores GPU planes.
    ordinals = gpu_trace.choose_gpu_planes(space, devices)
    markers, launches = _read_host(space, devices, columns, inputs_only=ordinals is not None)
    attribution = None
    if ordinals is not None:
        _add_gpu_spans(space, ordinals, columns, launches, markers)
        spans = columns.build()
        replica_count = replicas or len(ordinals)
        link_peak_gbps = link_peak_gbps or gpu_trace.DEFAULT_GPU_PEAK_GBPS
    else:
        spans = columns.build()
        replica_count = replicas or _cpu_replica_count(spans)
        spans, attribution = _attribute_cpu_replicas(spans, replica_count)
    facts = RunFacts(
        allreduce_bytes=allreduce_bytes,
        sparse_bytes=sparse_bytes,
        gather_bytes=gather_bytes,
        steps_covered=dict(steps_covered or {}),
        group_size=group_size or replica_count,
    )
    steps_index = _StepIndex(spans)
    rows = [
        row
        for index, marker in enumerate(markers)
        for row in _replica_rows(
            index, marker, spans, steps_index, range(replica_count), devices, facts, link_peak_gbps
        )
    ]
    replica_frame = pd.DataFrame(rows, columns=[*REPLICA_COLUMNS, *_BANDWIDTH_TIMES])
    replica_frame = replica_frame.astype(dict.fromkeys(_BANDWIDTHS, float))
    steps = _step_rows(replica_frame, facts, link_peak_gbps)
    return Breakdown(replica_frame[REPLICA_COLUMNS], steps, attribution=attribution)


def _cpu_replica_count(spans: _Spans) -> int:
    """Peers of the largest collective (one op per replica), else the replica scopes."""
    peers = Counter(spans.keys.values())
    unnamed = np.ones(len(spans.replica), dtype=bool)
    unnamed[list(spans.names)] = False
    scoped = spans.replica[unnamed & (spans.replica != _NO_REPLICA)]
    return max(peers.values(), default=0) or 1 + max(int(scoped.max()) if len(scoped) else 0, 0)


def analyze_trace(
    path: str | os.PathLike,
    *,
    allreduce_bytes: int | None = None,
    replicas: int | None = None,
    devices: Sequence[str] | None = None,
    group_size: int | None = None,
    link_peak_gbps: float | None = None,
    xprof: bool | None = None,
    **facts,
) -> Breakdown:
    """``analyze_xspace`` on one ``.xplane.pb`` file.

    Args:
        facts: ``sparse_bytes``, ``gather_bytes``, ``steps_covered`` (see ``RunFacts``).
        xprof: add XProf's own per-step numbers (``XPROF_COLUMNS``, from its
            ``input_pipeline_analyzer``). None (default) does so for GPU traces only:
            on CPU-only traces XProf reports no device time.
        Others: see ``analyze_xspace``.
    """
    space = load_xspace(path)
    breakdown = analyze_xspace(
        space,
        allreduce_bytes=allreduce_bytes,
        replicas=replicas,
        devices=devices,
        group_size=group_size,
        link_peak_gbps=link_peak_gbps,
        **facts,
    )
    breakdown.source = str(path)
    if xprof is None:
        xprof = bool(gpu_planes(space))
    if xprof and not breakdown.steps.empty:
        from keras_dp_tools.analysis.xprof_steps import xprof_step_table

        xprof_steps = _align_steps(xprof_step_table(Path(path)), breakdown.steps["step"])
        breakdown.steps = breakdown.steps.merge(xprof_steps, on="step", how="left")
    return breakdown


def _align_steps(xprof_steps: pd.DataFrame, steps: pd.Series) -> pd.DataFrame:
    """XProf names device steps by its own step groups (0, 1, ...) rather than the
    markers' ``step_num``; both list the steps in time order, so pair them by position
    when the numbers differ but the counts match (on GPU, XProf's 0, 1 would otherwise
    meet our steps 1, 2 one off)."""
    if set(xprof_steps["step"]) == set(steps) or len(xprof_steps) != len(steps):
        return xprof_steps
    return xprof_steps.assign(step=steps.sort_values().to_numpy())
