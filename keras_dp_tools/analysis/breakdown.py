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

import functools
import itertools
import operator
import os
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from keras_dp_tools.analysis import gpu_trace, intervals
from keras_dp_tools.analysis.classify import (
    KIND_CODES,
    PEER_KINDS,
    PER_REPLICA_COPY_TYPES,
    Kind,
    classify_host_name,
    copy_number,
    receiving_device,
    scoped_replica,
)
from keras_dp_tools.analysis.marker_checks import (
    Untrue,
    capture_length_ps,
    summary,
    untrue_markers,
)
from keras_dp_tools.analysis.replicas import packed_replica, peer_replicas
from keras_dp_tools.analysis.trace.xspace import (
    STEP_EVENT_NAME,
    StepMarker,
    TraceEvent,
    gpu_planes,
    host_planes,
    line_timestamps,
    named_stats,
    step_markers,
    stream_xspace,
)
from keras_dp_tools.records.columns import (
    MEAN_COLUMNS,
    REPLICA_COLUMNS,
    STEP_COLUMNS,
    XPROF_COLUMNS,
)

# The columns (keras_dp_tools.records.columns): MEAN_COLUMNS are the per-replica times (per
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
        unmeasured: None when every marked step was measured; otherwise which steps'
            markers cannot be true (``marker_checks``) and why. Their rows are kept
            with empty numbers and the reason in ``bandwidth_note``.
    """

    replicas: pd.DataFrame
    steps: pd.DataFrame
    source: str | None = None
    attribution: str | None = None
    unmeasured: str | None = None


def _peer_key(stats) -> tuple | None:
    """What identifies one collective across replicas. Seen in TF 2.21 captures: the k
    all-reduces of a ``steps_per_execution=k`` call share ``instance_key``, ``group_key``,
    ``step_id`` and ``frame_id`` and differ only in ``iter_id`` (0..k-1)."""
    get = stats.get
    if get("instance_key") is None:
        return None
    return get("group_key"), get("instance_key"), get("step_id"), get("frame_id"), get("iter_id")


# Kinds as small integers, for the span columns.
_KINDS = list(Kind)
_CODE = KIND_CODES
_NO_REPLICA = -1  # a span shared by all replicas
_UNTRUE = "not measured: "  # the bandwidth_note of a step whose marker cannot be true
_MARKER, _LAUNCH = "marker", "launch"  # host events read for their stats, not as spans


@dataclass
class _Spans:
    """The spans of a trace as columns (one entry per span, in trace order until
    ``_sort_by_start``).

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
    # Once sorted by start, the peer keys as integers (``_key_ids``) replace ``keys``,
    # and ``names`` (read by the replica attribution, in trace order) are dropped.
    key_ids: tuple | None = None


class _SpanColumns:
    """Collects spans into ``_Spans``: whole lines at once as arrays (``extend``), or
    row by row (``add``). The columns most spans leave at their default (launch link,
    bandwidth use) are kept sparse."""

    def __init__(self, origin_ps: int):
        self.origin_ps = origin_ps
        self.count = 0
        self.chunks: list[tuple[np.ndarray, ...]] = []  # (kind, replica, start, end)
        self.rows: list[tuple[int, int, int, int]] = []  # added one by one, not yet chunked
        self.launched: dict[int, int] = {}
        self.not_reducing: list[int] = []
        # (first position, array) of the launch links and bandwidth flags ``extend`` took.
        self.launched_runs: list[tuple[int, np.ndarray]] = []
        self.reducing_runs: list[tuple[int, np.ndarray]] = []
        self.keys, self.names = {}, {}

    def add(self, kind, replica, start, end, launched=-1, reducing=True, key=None, name=""):
        position = self.count
        if key is not None:
            self.keys[position] = key
        if name:
            self.names[position] = name
        if launched >= 0:
            self.launched[position] = launched
        if not reducing:
            self.not_reducing.append(position)
        self.rows.append((kind, _NO_REPLICA if replica is None else replica, start, end))
        self.count += 1

    def extend(
        self, kind, replica, start, end, keys=None, names=None, launched=None, reducing=None
    ) -> None:
        """Appends spans given as arrays; ``keys`` and ``names`` by index in them;
        ``launched`` and ``reducing`` as arrays (as ``add``'s arguments per span)."""
        self._chunk_rows()
        for index, key in sorted((keys or {}).items()):  # in trace order, as ``add``
            self.keys[self.count + index] = key
        for index, name in sorted((names or {}).items()):
            self.names[self.count + index] = name
        if launched is not None:
            self.launched_runs.append((self.count, launched))
        if reducing is not None:
            self.reducing_runs.append((self.count, reducing))
        self._append(kind, replica, start, end)
        self.count += len(kind)

    def _append(self, kind, replica, start, end) -> None:
        # Kinds and replicas are small numbers: held compact from the start.
        self.chunks.append((kind.astype(np.int8, copy=False), _compact(replica), start, end))

    def _chunk_rows(self) -> None:
        if self.rows:
            self._append(*np.array(self.rows, dtype=np.int64).T)
            self.rows = []

    def build(self, release_memory: Callable[[], None]) -> _Spans:
        self._chunk_rows()
        # Column by column, each column's chunks freed once joined and their memory
        # handed back: the spans are held about once, not twice, at the peak.
        parts = [list(column) for column in zip(*self.chunks, strict=True)] or [[]] * 4
        self.chunks = []
        kind, replica, start, end = (
            _join(parts, column, dtype, release_memory)
            for column, dtype in enumerate((np.int8, np.int16, np.int64, np.int64))
        )
        # Marker indices: int32 unless a trace ever holds 2**31 markers.
        largest = max(
            [
                *self.launched.values(),
                *(int(run.max()) for _, run in self.launched_runs if len(run)),
            ],
            default=0,
        )
        launched = np.full(self.count, -1, dtype=_index_dtype(largest))
        launched[np.fromiter(self.launched, np.int64)] = np.fromiter(
            self.launched.values(), np.int64
        )
        reducing = np.ones(self.count, dtype=bool)
        reducing[self.not_reducing] = False
        for first, run in self.launched_runs:
            launched[first : first + len(run)] = run
        for first, run in self.reducing_runs:
            reducing[first : first + len(run)] = run
        self.launched_runs, self.reducing_runs = [], []
        keys, names, self.keys, self.names = self.keys, self.names, {}, {}  # handed over
        return _Spans(self.origin_ps, kind, replica, start, end, launched, reducing, keys, names)


def _sort_by_start(spans: _Spans, release_memory: Callable[[], None]) -> None:
    """Puts the spans in order of start, in place (stable: equal starts keep trace
    order), so the step index needs no positions and no copy of the starts. The sync
    waits break ties of clipped starts by this order: real start, then trace order.
    Holds a column twice at most, one at a time; columns of one value (CPU traces:
    launch links, bandwidth use) take no memory."""
    count = len(spans.start)
    for column in ("launched", "reducing"):
        values = getattr(spans, column)
        if len(values) and not (values != values[0]).any():
            setattr(spans, column, np.broadcast_to(values[:1].copy(), values.shape))
    key_ids, iteration_ids = _key_ids(spans)
    spans.keys, spans.names = {}, {}
    release_memory()
    order = np.argsort(spans.start, kind="stable").astype(_index_dtype(count), copy=False)
    release_memory()  # the int64 order, where glibc put it on the heap
    marked = np.zeros(count, dtype=bool)
    marked[key_ids.positions] = True
    moved = np.flatnonzero(marked[order])  # new positions of the keyed spans
    del marked
    new_of = dict(zip(order[moved].tolist(), moved.tolist(), strict=True))
    new_positions = np.fromiter(map(new_of.__getitem__, key_ids.positions.tolist()), np.int64)
    spans.key_ids = _KeyIds(new_positions, key_ids.ids), iteration_ids
    for column in ("kind", "replica", "start", "end", "launched", "reducing"):
        values = getattr(spans, column)
        if values.strides != (0,):  # not one value
            setattr(spans, column, values[order])
            del values
            release_memory()  # the column in trace order
    del order
    release_memory()


def _index_dtype(largest: int):
    return np.int32 if largest < np.iinfo(np.int32).max else np.int64


def _compact(values: np.ndarray) -> np.ndarray:
    """``values`` as int16 where they fit (replica numbers always do in practice):
    a quarter of the memory of the engine's most repeated small column."""
    limits = np.iinfo(np.int16)
    if not len(values) or (values.min() >= limits.min and values.max() <= limits.max):
        return values.astype(np.int16)
    return values


def _join(parts: list[list[np.ndarray]], column: int, dtype, release_memory) -> np.ndarray:
    """One column's chunks joined (in ``dtype``, or wider where a chunk needs it)."""
    chunks, parts[column] = parts[column], []
    if not chunks:
        return np.empty(0, dtype)
    joined = np.concatenate(chunks, dtype=np.result_type(dtype, *chunks))
    chunks.clear()
    release_memory()
    return joined


def _memory_release(enabled: bool) -> Callable[[], None]:
    """What the analysis calls between its stages to hand memory freed inside the C
    heap back to the system: glibc's ``malloc_trim`` if ``enabled`` (and glibc is
    there), else nothing. The line-sized arrays the reading leaves are below glibc's
    mmap threshold: once freed, their pages stay in the process (about the size of the
    spans) unless trimmed, and the analysis peaks after. Trimming takes the heap's
    locks and a trimmed page faults back in when reused: right for a process of its
    own, not for a thread beside training (the caller decides: ``release_memory``)."""
    trim = _malloc_trim() if enabled else None
    return _keep_memory if trim is None else functools.partial(trim, 0)


def _keep_memory() -> None:
    """Leaves freed memory to the heap, for reuse within the process."""


@functools.cache
def _malloc_trim():
    try:
        import ctypes

        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError, TypeError):  # not glibc (musl, macOS, Windows)
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


# Relative picoseconds must fit int64 (~106 days) with room for the events' offsets.
_MAX_SPREAD_PS = 1 << 62


def _origin_ps(space) -> int:
    """The earliest start of a line that holds events on the planes the analysis reads
    (host and GPU), so every relative picosecond is >= about 0 and fits int64. Lines
    without events are left out: their ``timestamp_ns`` may be 0.

    Raises:
        gpu_trace.UnusableTraceError: the lines start too far apart (different clocks)
            for one timeline.
    """
    starts = [
        timestamp * 1000
        for plane in [*host_planes(space), *gpu_planes(space).values()]
        for timestamp in line_timestamps(plane)
    ]
    if not starts:
        return 0
    earliest, latest = min(starts), max(starts)
    if latest - earliest > _MAX_SPREAD_PS:
        days = (latest - earliest) / 1e12 / 86400
        raise gpu_trace.UnusableTraceError(
            f"The trace's lines start {days:,.0f} days apart (timestamp_ns "
            f"{earliest // 1000} and {latest // 1000}): they are not on one clock, so its "
            "events cannot be placed in the steps. Capture the window again; if it "
            "recurs, report the trace."
        )
    return earliest


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


_EVENT_FIELDS = operator.attrgetter("metadata_id", "offset_ps", "duration_ps")


def _event_columns(events) -> np.ndarray:
    """Metadata id, offset and duration of every event of a line, as an (n, 3) array:
    the only step taken per event in Python (the attribute reads run in C)."""
    flat = itertools.chain.from_iterable(map(_EVENT_FIELDS, events))
    return np.fromiter(flat, np.int64, 3 * len(events)).reshape(-1, 3)


class _PlainRoles:
    """The spans' kind, replica and name of the event metadata whose events need no
    stats read, as arrays sorted by metadata id (looked up per line with searchsorted)."""

    def __init__(self, plain: dict[int, tuple[int, int, str]]):
        ids = sorted(plain)
        self.ids = np.array(ids, dtype=np.int64)
        self.kind = np.array([plain[key][0] for key in ids], dtype=np.int8)
        self.replica = np.array([plain[key][1] for key in ids], dtype=np.int64)
        self.names = [plain[key][2] for key in ids]
        self.named = np.array([bool(name) for name in self.names], dtype=bool)

    def find(self, metadata_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Which events have a plain role, and the index of their role."""
        if not len(self.ids):
            return np.zeros(len(metadata_ids), bool), np.zeros(len(metadata_ids), np.int64)
        index = np.minimum(np.searchsorted(self.ids, metadata_ids), len(self.ids) - 1)
        return self.ids[index] == metadata_ids, index


def _read_host(space, devices, columns: _SpanColumns, inputs_only: bool):
    """One pass over the host planes: the spans of classified events (into ``columns``;
    only input waits if ``inputs_only``), the step markers as ``TraceEvent`` (few
    events), the CUDA launches as arrays (``gpu_trace.read_launches``) and the host
    events' extent: the earliest start of any and the latest end of one that is not a
    step marker (absolute picoseconds; None: no events). Events are
    classified by their metadata, once, and read line by line into arrays; only the
    events whose stats matter (collectives, markers) are read one by one."""
    markers, launches = [], []
    origin = columns.origin_ps
    earliest = latest_other = None  # from the origin
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
                special[key] = (role, meta.name, named_stats(meta.stats, stat_names))
        roles = _PlainRoles(plain)
        special_ids = np.array(sorted(special), dtype=np.int64)
        # CUDA launches (one per kernel) are read as arrays (gpu_trace.read_launches).
        launch_ids = np.array([k for k, v in special.items() if v[0][0] == _LAUNCH], np.int64)
        marker_ids = np.array([k for k, v in special.items() if v[0][0] == _MARKER], np.int64)
        correlation = gpu_trace.PlaneCorrelation.of(plane, launch_ids.tolist())
        for line in plane.lines:
            if not len(line.events):
                continue
            line_name = line.display_name or line.name
            off_python = line_name != "python"  # eager ops and tracing: host overhead
            base = line.timestamp_ns * 1000 - origin
            events = _event_columns(line.events)
            place = f"plane {plane.name}, line {line_name!r}"
            gpu_trace.event_times(base, events[:, 1], events[:, 2], place)  # or raise
            first = base + int(events[:, 1].min())
            earliest = first if earliest is None else min(earliest, first)
            metadata_ids = events[:, 0]
            others = ~np.isin(metadata_ids, marker_ids)
            if others.any():
                last = base + int((events[others, 1] + events[others, 2]).max())
                latest_other = last if latest_other is None else max(latest_other, last)
            rows = []  # spans of events read one by one: (event index, span)
            launched = np.isin(metadata_ids, launch_ids)
            if launched.any():
                launches.append(
                    gpu_trace.read_launches(
                        line, np.flatnonzero(launched), base + events[:, 1], correlation
                    )
                )
            for index in np.flatnonzero(np.isin(metadata_ids, special_ids) & ~launched).tolist():
                role, name, meta_stats = special[int(metadata_ids[index])]
                if len(role) == 4 and not off_python:
                    continue
                event = line.events[index]
                stats = meta_stats
                if event.stats:
                    stats = {**meta_stats, **named_stats(event.stats, stat_names)}
                start = base + origin + event.offset_ps
                end = start + event.duration_ps
                traced = TraceEvent(plane.name, line_name, name, start, end, stats, line.id)
                if role[0] == _MARKER:
                    markers.append(traced)
                else:
                    rows.append((index, _host_span(role, traced, devices, origin)))
            if off_python:
                _extend_line(columns, roles, events, base, rows)
    if earliest is None:
        return step_markers(markers), launches, None
    extent = origin + earliest, None if latest_other is None else origin + latest_other
    return step_markers(markers), launches, extent


def _extend_line(columns: _SpanColumns, roles: _PlainRoles, events, base: int, rows) -> None:
    """Adds a line's spans in event order: the plain ones (arrays) and ``rows``."""
    found, role = roles.find(events[:, 0])
    plain = np.flatnonzero(found)
    role = role[plain]
    index = np.concatenate([plain, np.array([row[0] for row in rows], dtype=np.int64)])
    if not len(index):
        return
    special = np.array([row[1][:4] for row in rows], dtype=np.int64).reshape(-1, 4)
    kind = np.concatenate([roles.kind[role], special[:, 0].astype(np.int8)])
    replica = np.concatenate([roles.replica[role], special[:, 1]])
    start = np.concatenate([base + events[plain, 1], special[:, 2]])
    end = np.concatenate([base + events[plain, 1] + events[plain, 2], special[:, 3]])
    order = np.argsort(index, kind="stable")
    at = np.empty(len(order), dtype=np.int64)
    at[order] = np.arange(len(order))  # where each span lands in event order
    named = np.flatnonzero(roles.named[role])
    names = {
        int(at[i]): roles.names[r]
        for i, r in zip(named.tolist(), role[named].tolist(), strict=True)
    }
    keys = {}
    for offset, (_, (_, _, _, _, key, name)) in enumerate(rows, start=len(plain)):
        if key is not None:
            keys[int(at[offset])] = key
        if name:
            names[int(at[offset])] = name
    columns.extend(kind[order], replica[order], start[order], end[order], keys, names)


def _host_span(role, event: TraceEvent, devices, origin: int) -> tuple:
    """(kind, replica, start, end, peer key, name) of a host event read with its stats."""
    kind_code, replica, _, copied = role
    kind = _KINDS[kind_code]
    if kind is Kind.COPY and replica is not None and scoped_replica(event.name) is None:
        # An unscoped transfer (e.g. feeding replica 3's collective from /cpu:0) serves
        # the replica that receives it.
        replica = _device_replica(receiving_device(event), devices, replica)
    key = _peer_key(event.stats) if kind in PEER_KINDS else None
    replica = _NO_REPLICA if replica is None else replica
    name = event.name if copied else ""
    return kind_code, replica, event.start_ps - origin, event.end_ps - origin, key, name


def _attribute_cpu_replicas(spans: _Spans, replica_count: int) -> tuple[_Spans, str | None]:
    """Gives the per-replica copies of collectives and packing ops their replica (see
    ``keras_dp_tools.analysis.replicas``); returns the spans and why some could not be
    attributed (None if all could)."""
    peers: dict[object, list[int]] = defaultdict(list)
    for position, key in spans.keys.items():
        peers[key].append(position)
    replica_of: dict[int, int] = {}
    reasons = []
    decided: dict[tuple[str, ...], tuple] = {}  # every step repeats the same names
    for positions in peers.values():
        names = tuple(spans.names[p].rsplit(":", 1)[0] for p in positions)
        if names not in decided:
            scoped = all(scoped_replica(name) is not None for name in names)
            decided[names] = None if scoped else peer_replicas(list(names), replica_count)
        if decided[names] is None:
            continue  # replica scopes say it
        replicas, reason = decided[names]
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


def _add_gpu_spans(gpus: gpu_trace.ReplicaGpus, columns: _SpanColumns, launches, markers):
    """Adds each replica's device events as arrays, each linked by its correlation id
    to the marker that enclosed its host launch."""
    links = gpu_trace.launch_links(launches, markers, columns.origin_ps)
    for replica, events in enumerate(gpus.events):
        columns.extend(
            events.kind,
            np.full(len(events.kind), replica, dtype=np.int16),
            events.start,
            events.end,
            launched=gpu_trace.launching_markers(events.correlation, links),
            reducing=events.reducing,
        )


def _bus_bandwidth(nbytes, transfer_ms, ranks, collective="allreduce"):
    """nccl-tests' (algbw, busbw) in GB/s for ``nbytes`` moved in ``transfer_ms``
    (arrays; NaN where no bytes moved, no transfer time or no ranks)."""
    nbytes = np.asarray(nbytes, dtype=float)
    transfer_ms = np.asarray(transfer_ms, dtype=float)
    shown = (nbytes != 0) & ~np.isnan(nbytes) & (transfer_ms > 0) & bool(ranks)
    with np.errstate(divide="ignore", invalid="ignore"):
        algbw = np.where(shown, nbytes / (transfer_ms / 1e3) / 1e9, np.nan)
    return algbw, algbw * _BUS_FACTORS[collective](ranks) if ranks else algbw


def _bandwidths(nbytes, transfer_ms, ranks, collective="allreduce"):
    """``_bus_bandwidth`` of one row: (algbw, busbw), or (None, None)."""
    algbw, busbw = _bus_bandwidth(nbytes or 0, transfer_ms or 0, ranks, collective)
    if np.isnan(algbw):
        return None, None
    return float(algbw), float(busbw)


def _sizes_and_bandwidths(
    times: Mapping[str, np.ndarray], reduce_bytes, gather_bytes, bytes_known, ranks, peak_gbps
) -> dict[str, list]:
    """Per row: bytes of its all-reduce and all-gather (None where it has none, or with
    one rank), its total over the steps it covers, and each one's bandwidth from its own
    bytes and transfer time; a bandwidth above ``peak_gbps`` is left out and
    ``bandwidth_note`` says why the all-reduce bandwidth is empty.

    ``times``: ``reduce_ms``, ``gather_ms``, ``reduce_transfer_ms``,
    ``gather_transfer_ms`` and ``steps`` per row; ``reduce_bytes``, ``gather_bytes``,
    ``bytes_known``: per row (None: unknown). Columns come out as lists with None, for
    pandas to type as it types records.
    """
    multi = bool(ranks and ranks > 1)
    reduce_present = _known(reduce_bytes) & (times["reduce_ms"] > 0) & multi
    gather_present = _known(gather_bytes) & (times["gather_ms"] > 0) & multi
    reduce_values = np.where(reduce_present, _values(reduce_bytes), 0)
    gather_values = np.where(gather_present, _values(gather_bytes), 0)
    algbw, busbw = _bus_bandwidth(reduce_values, times["reduce_transfer_ms"], ranks)
    too_fast = ~np.isnan(busbw) & (peak_gbps is not None) & (busbw > (peak_gbps or 0))
    shown = ~np.isnan(busbw) & ~too_fast
    gather_busbw = _bus_bandwidth(gather_values, times["gather_transfer_ms"], ranks, "allgather")[1]
    gather_busbw[gather_busbw > (peak_gbps if peak_gbps is not None else np.inf)] = np.nan
    notes = np.full(len(shown), None, dtype=object)
    for row in np.flatnonzero(too_fast):
        notes[row] = gpu_trace.check_bandwidth(float(busbw[row]), peak_gbps)
    transfer = times["reduce_transfer_ms"]
    missing = np.select(
        [np.full(len(shown), not multi), ~np.asarray(bytes_known, dtype=bool), ~(transfer > 0)],
        [_NO_RANKS, _NO_BYTES, _NO_REDUCE],
        None,
    )
    notes = np.where(~shown & ~too_fast, missing, notes)
    total = (reduce_values + gather_values) * np.asarray(times["steps"], dtype=np.int64)
    return {
        "allreduce_bytes": _nullable(reduce_values, reduce_present),
        "gather_bytes": _nullable(gather_values, gather_present),
        "row_bytes": _nullable(total, total != 0),
        "algbw_gbps": _nullable(algbw, shown),
        "busbw_gbps": _nullable(busbw, shown),
        "gather_busbw_gbps": _nullable(gather_busbw, ~np.isnan(gather_busbw)),
        "bandwidth_note": notes.tolist(),
    }


_NO_RANKS = "one replica: nothing to all-reduce"
_NO_BYTES = "all-reduce bytes unknown (pass allreduce_bytes)"
_NO_REDUCE = "no all-reduce collective ran in this step"


def _known(values) -> np.ndarray:
    return np.array([value is not None for value in values], dtype=bool)


def _values(values) -> np.ndarray:
    """Python numbers (None: 0) as an array of their own type (int or float)."""
    return np.array([0 if value is None else value for value in values])


def _nullable(values: np.ndarray, present: np.ndarray) -> list:
    """``values`` as Python numbers, None where not ``present``."""
    return [
        value if keep else None
        for value, keep in zip(values.tolist(), present.tolist(), strict=True)
    ]


# Bits of the things a step's union lengths are taken over.
_COMPUTE, _REDUCE, _GATHER, _INPUT, _REDUCING, _WAIT = (1 << bit for bit in range(6))


# Spans per block of the step index's maxima of ends.
_REACH_BLOCK = 256


class _StepIndex:
    """Finds the spans of a run of markers without scanning them all: spans launched by
    a marker are sorted by marker; the others are found by time in the spans sorted
    by start (``_sort_by_start``): up to a binary search on the starts, in the blocks
    (of ``_REACH_BLOCK`` spans) whose latest end comes after the run starts. One
    maximum per block (a few kB, not a span-sized array), and not a running maximum: a
    span lasting the whole trace brings its own block into every run, not every block
    after it. Launched spans are left out of the maxima (they are found by marker)."""

    def __init__(self, spans: _Spans):
        linked = spans.launched >= 0
        launched = np.flatnonzero(linked)
        self.launched = launched[np.argsort(spans.launched[launched], kind="stable")]
        self.launcher = spans.launched[self.launched]
        self.linked = linked if len(launched) else None  # CPU traces: every span by time
        del linked, launched
        self.reach = _block_maxima(spans.end, self.linked)
        self.starts, self.ends = spans.start, spans.end

    def spans(self, first: int, stop: int, start: int, end: int) -> np.ndarray:
        """Positions of the spans launched by markers ``first..stop-1`` or overlapping
        ``(start, end)`` (a superset of what the markers hold)."""
        launched = self.launched[
            np.searchsorted(self.launcher, first) : np.searchsorted(self.launcher, stop)
        ]
        high = int(np.searchsorted(self.starts, end, side="left"))
        blocks = np.flatnonzero(self.reach[: -(-high // _REACH_BLOCK)] > start)
        candidates = (blocks[:, None] * _REACH_BLOCK + np.arange(_REACH_BLOCK)).ravel()
        candidates = candidates[candidates < high]
        if self.linked is not None:
            candidates = candidates[~self.linked[candidates]]
        return np.concatenate([launched, candidates[self.ends[candidates] > start]])


def _block_maxima(ends: np.ndarray, skipped: np.ndarray | None) -> np.ndarray:
    """The latest end of each block of ``_REACH_BLOCK`` spans, leaving out the
    ``skipped`` ones (a block of only those: the smallest int64), a few blocks at a time
    so that no span-sized temporary is made."""
    if skipped is None:
        heads = np.arange(0, len(ends), _REACH_BLOCK)
        return np.maximum.reduceat(ends, heads) if len(ends) else ends.copy()
    lowest = np.iinfo(np.int64).min
    piece = _REACH_BLOCK * 256
    maxima = []
    for first in range(0, len(ends), piece):
        kept = np.where(skipped[first : first + piece], lowest, ends[first : first + piece])
        maxima.append(np.maximum.reduceat(kept, np.arange(0, len(kept), _REACH_BLOCK)))
    return np.concatenate(maxima) if maxima else np.empty(0, np.int64)


def _step_pairs(starts, marker_ends, spans: _Spans, candidates, first: int):
    """Which spans each of a run of markers holds, clipped to the step, as parallel
    arrays: marker index (in the run), span position, start, end; plus each step's
    end. ``candidates``: positions of the spans that may belong to the run, whose first
    marker is marker ``first`` of the trace.

    A device event launched inside a marker belongs to it whenever it ran; the step then
    lasts until its last launched event ends. Events without that link belong to every
    marker they overlap, clipped to each.
    """
    linked = spans.launched[candidates] >= 0
    launched = candidates[linked]
    launcher = spans.launched[launched] - first
    ends = marker_ends.copy()
    np.maximum.at(ends, launcher, spans.end[launched])
    # By time: markers are sorted by start; the running maximum of their ends bounds
    # the first marker a span can overlap, the starts the last.
    unlinked = candidates[~linked]
    low = np.searchsorted(np.maximum.accumulate(marker_ends), spans.start[unlinked], "right")
    high = np.searchsorted(starts, spans.end[unlinked], "left")
    count = np.maximum(high - low, 0)
    positions = np.repeat(unlinked, count)
    owners = np.repeat(low - (np.cumsum(count) - count), count) + np.arange(len(positions))
    overlap = marker_ends[owners] > spans.start[positions]
    positions, owners = positions[overlap], owners[overlap]
    marker = np.concatenate([launcher, owners])
    position = np.concatenate([launched, positions])
    stop = np.concatenate([ends[launcher], marker_ends[owners]])
    pair_start = np.maximum(spans.start[position], starts[marker])
    pair_end = np.minimum(spans.end[position], stop)
    return marker, position, pair_start, pair_end, ends


def _sync_waits(marker, position, start, end, spans: _Spans, key_ids):
    """The time each collective spent before the last peer of the same collective
    started, as (marker, replica, start, end) arrays: what better balance would save.

    Peers share a peer key (``instance_key`` ...); without one (NCCL kernels) the i-th
    collective of each replica in a step (by start) is the same operation, as NCCL
    requires the same order on every rank. All-reduces and all-gathers wait apart.
    Collectives clipped to the same start (both began before the step) are in the order
    they really started, then in trace order.
    """
    kind = spans.kind[position].astype(np.int64)
    peer = np.flatnonzero((kind == _CODE[Kind.COLLECTIVE]) | (kind == _CODE[Kind.GATHER]))
    marker, position, kind = marker[peer], position[peer], kind[peer]
    start, end = start[peer], end[peer]
    replica, key = spans.replica[position], key_ids[position]
    # Each replica's collectives of a step in order: by start in the step, then by real
    # start and trace order (the spans' positions, sorted stably by start).
    order = np.lexsort((position, start, replica, kind, marker))
    ordinal = np.empty(len(order), dtype=np.int64)
    ordinal[order] = _rank_in_group(marker[order], kind[order], replica[order])
    keyed = key >= 0
    peer_id = np.where(keyed, key, ordinal)  # same (step, kind, keyed, peer_id): peers
    order = np.lexsort((peer_id, keyed, kind, marker))
    heads = _group_heads(marker[order], kind[order], keyed[order], peer_id[order])
    size = np.diff(np.append(heads, len(order)))
    last = np.repeat(np.maximum.reduceat(start[order], heads), size) if len(order) else start
    waiting = order[(np.repeat(size, size) > 1) & (start[order] < last)]
    last_of = np.empty(len(order), dtype=np.int64)
    last_of[order] = last
    return (
        marker[waiting],
        replica[waiting],
        start[waiting],
        np.minimum(last_of[waiting], end[waiting]),
    )


def _group_heads(*columns) -> np.ndarray:
    """Where each run of equal rows of the (sorted) ``columns`` starts."""
    if not len(columns[0]):
        return np.empty(0, dtype=np.int64)
    change = np.zeros(len(columns[0]), dtype=bool)
    change[0] = True
    for column in columns:
        change[1:] |= column[1:] != column[:-1]
    return np.flatnonzero(change)


def _rank_in_group(*columns) -> np.ndarray:
    """Each row's position within its run of equal rows of the (sorted) ``columns``."""
    heads = _group_heads(*columns)
    sizes = np.diff(np.append(heads, len(columns[0])))
    return np.arange(len(columns[0])) - np.repeat(heads, sizes)


class _KeyIds:
    """Peer keys as integers, looked up by span positions (-1: none): held only for
    the collectives, not per span."""

    def __init__(self, positions: np.ndarray, ids: np.ndarray):
        order = np.argsort(positions)
        self.positions, self.ids = positions[order], ids[order]

    def __getitem__(self, positions) -> np.ndarray:
        positions = np.asarray(positions)
        if not len(self.positions):
            return np.full(positions.shape, -1, dtype=np.int64)
        at = np.minimum(np.searchsorted(self.positions, positions), len(self.positions) - 1)
        return np.where(self.positions[at] == positions, self.ids[at], -1)


def _key_ids(spans: _Spans):
    """Peer keys as integers by span position (``_KeyIds``) and each key's
    ``iter_id`` as an integer (-1: none)."""
    ids: dict[tuple, int] = {}
    key_ids = _KeyIds(
        np.fromiter(spans.keys, np.int64, len(spans.keys)),
        np.fromiter((ids.setdefault(key, len(ids)) for key in spans.keys.values()), np.int64),
    )
    iterations: dict[object, int] = {}
    iteration_ids = np.array(
        [-1 if key[-1] is None else iterations.setdefault(key[-1], len(iterations)) for key in ids],
        dtype=np.int64,
    )
    return key_ids, iteration_ids


# The union lengths of each (step, replica): name -> the bits of what it covers.
_LENGTHS = {
    "compute": _COMPUTE,
    "comm": _REDUCE | _GATHER,
    "wait": _WAIT,
    "busy": _COMPUTE | _REDUCE | _GATHER,
    "busy_or_input": _COMPUTE | _REDUCE | _GATHER | _INPUT,
    "compute_or_wait": _COMPUTE | _WAIT,
    "gather": _GATHER,
    "gather_or_wait": _GATHER | _WAIT,
    "reducing_or_wait": _REDUCING | _WAIT,
    "reduce": _REDUCE,
}


def _batch_lengths(
    step_start, marker_ends, spans: _Spans, candidates, first, replica_count, keys, multi
) -> dict[str, np.ndarray]:
    """For a run of markers: per marker its end, dispatch and idle time, iterations and
    whether it all-gathers; per (marker, replica) the ``_LENGTHS``."""
    key_ids, iteration_ids = keys
    count = len(step_start)
    marker, position, start, end, step_end = _step_pairs(
        step_start, marker_ends, spans, candidates, first
    )
    kind = spans.kind[position]
    owner = spans.replica[position]
    # The time any replica runs anything; every replica's busy time lies inside it, so
    # what is left of the step before the first and after the last span is dispatch,
    # and gaps between spans are idle.
    ran = end > start
    first_start = step_end.copy()
    np.minimum.at(first_start, marker[ran], start[ran])
    last = np.full(count, np.iinfo(np.int64).min)
    np.maximum.at(last, marker[ran], end[ran])
    any_ran = np.bincount(marker[ran], minlength=count) > 0
    last = np.where(any_ran, last, step_end)
    order = np.lexsort((start, marker))
    busy_any = intervals.union_lengths(marker[order], start[order], end[order], count)
    del order, ran
    # Steps each call covers, as its collectives count them (distinct iter_id).
    peers = (kind == _CODE[Kind.COLLECTIVE]) | (kind == _CODE[Kind.GATHER])
    keyed = peers & (key_ids[position] >= 0)
    iteration = iteration_ids[key_ids[position[keyed]]]
    counted = np.unique(
        np.stack([marker[keyed][iteration >= 0], iteration[iteration >= 0]]), axis=1
    )
    per_marker = {
        "step_end": step_end,
        "dispatch": (first_start - step_start) + (step_end - last),
        "idle": np.where(any_ran, last - first_start - busy_any, 0),
        "iterations": np.maximum(np.bincount(counted[0], minlength=count), 1),
        "has_gathers": np.bincount(marker[kind == _CODE[Kind.GATHER]], minlength=count) > 0,
    }
    # What each span counts towards; one rank has nothing to exchange (its sends, seen
    # with OneDeviceStrategy off /cpu:0, are the step's results going back to the host).
    flags = np.zeros(len(kind), dtype=np.int8)
    flags[kind == _CODE[Kind.COMPUTE]] = _COMPUTE
    flags[kind == _CODE[Kind.INPUT]] = _INPUT
    if multi:
        flags[(kind == _CODE[Kind.COLLECTIVE]) | (kind == _CODE[Kind.COPY])] = _REDUCE
        flags[kind == _CODE[Kind.GATHER]] = _GATHER
        flags[(kind == _CODE[Kind.COLLECTIVE]) & spans.reducing[position]] |= _REDUCING
    wait_marker, wait_replica, wait_start, wait_end = _sync_waits(
        marker, position, start, end, spans, key_ids
    )
    # Each replica's items: its own spans, the shared ones (copied to every replica),
    # and its waits; grouped by (step, replica).
    own = (owner >= 0) & (owner < replica_count)
    shared = np.flatnonzero(owner == _NO_REPLICA)
    waits = (wait_replica >= 0) & (wait_replica < replica_count)
    group = np.concatenate(
        [
            marker[own] * replica_count + owner[own],
            (marker[shared, None] * replica_count + np.arange(replica_count)).ravel(),
            wait_marker[waits] * replica_count + wait_replica[waits],
        ]
    )
    item_start = np.concatenate(
        [start[own], np.repeat(start[shared], replica_count), wait_start[waits]]
    )
    item_end = np.concatenate([end[own], np.repeat(end[shared], replica_count), wait_end[waits]])
    item_flags = np.concatenate(
        [flags[own], np.repeat(flags[shared], replica_count), np.full(waits.sum(), _WAIT, np.int8)]
    )
    del marker, position, start, end, kind, owner, flags
    order = np.lexsort((item_start, group))
    group, item_start, item_end, item_flags = (
        group[order],
        item_start[order],
        item_end[order],
        item_flags[order],
    )
    rows = count * replica_count
    per_row = {}
    for name, bits in _LENGTHS.items():
        chosen = (item_flags & bits) != 0
        per_row[name] = intervals.union_lengths(
            group[chosen], item_start[chosen], item_end[chosen], rows
        )
    return {**per_marker, **per_row}


# Spans per batch of markers: bounds the engine's memory (its arrays are a few times
# the spans it holds) while keeping numpy's per-call overhead small.
_BATCH_SPANS = 1 << 15


def _replica_frame(
    markers,
    spans: _Spans,
    replica_count,
    devices,
    facts: RunFacts,
    peak_gbps,
    release_memory,
    unmeasured: Mapping[int, str],
):
    """One row per step and replica (``REPLICA_COLUMNS`` and ``_BANDWIDTH_TIMES``).
    Vectorised over steps: each span is assigned to its steps once, then the union
    lengths of all (step, replica) groups come from one sort, batch by batch of
    markers. The rows of the markers in ``unmeasured`` have empty times, sizes and
    bandwidths, and their note as ``bandwidth_note``."""
    columns = [*REPLICA_COLUMNS, *_BANDWIDTH_TIMES]
    if not markers:
        return pd.DataFrame([], columns=columns)
    count = len(markers)
    origin = spans.origin_ps
    step_start = np.fromiter((m.start_ps - origin for m in markers), np.int64, count)
    marker_ends = np.fromiter((m.end_ps - origin for m in markers), np.int64, count)
    index = _StepIndex(spans)
    key_ids, iteration_ids = spans.key_ids
    ranks = facts.group_size
    multi = bool(ranks and ranks > 1)
    per_batch = max(1, _BATCH_SPANS * count // max(len(spans.kind), 1))
    batches = []
    for first in range(0, count, per_batch):
        stop = min(first + per_batch, count)
        candidates = index.spans(
            first, stop, int(step_start[first]), int(marker_ends[first:stop].max())
        )
        batches.append(
            _batch_lengths(
                step_start[first:stop],
                marker_ends[first:stop],
                spans,
                candidates,
                first,
                replica_count,
                (key_ids, iteration_ids),
                multi,
            )
        )
    del index, key_ids, iteration_ids, spans  # gone before the rows are built (take_spans)
    release_memory()
    lengths = {name: np.concatenate([batch[name] for batch in batches]) for name in batches[0]}
    step_end = lengths.pop("step_end")
    steps = np.array(
        [
            facts.steps_covered.get(m.step) or int(n)
            for m, n in zip(markers, lengths.pop("iterations"), strict=True)
        ],
        dtype=np.int64,
    )
    has_gathers = lengths.pop("has_gathers")
    dispatch, idle = lengths.pop("dispatch"), lengths.pop("idle")
    compute, comm, wait = lengths["compute"], lengths["comm"], lengths["wait"]
    busy, busy_or_input = lengths["busy"], lengths["busy_or_input"]
    replicas = np.arange(replica_count)
    rows = count * replica_count
    # Set algebra on lengths: |A - B| = |A + B| - |B|, |A & B| = |A| + |B| - |A + B|.
    exposed_comm = busy - compute
    exposed_wait = lengths["compute_or_wait"] - compute
    per_row = np.repeat  # a step's value on each of its replicas' rows
    length = per_row(step_end - step_start, replica_count)
    other = length - busy_or_input
    to_ms = per_row(1e-9 / steps, replica_count)  # picoseconds of a call to ms per step
    row_dispatch, row_idle = per_row(dispatch, replica_count), per_row(idle, replica_count)
    step_ms = length * to_ms
    exposed_transfer_ms = (exposed_comm - exposed_wait) * to_ms
    exposed_sync_wait_ms = exposed_wait * to_ms
    nonzero = step_ms != 0
    with np.errstate(divide="ignore", invalid="ignore"):
        comm_share = np.where(nonzero, exposed_transfer_ms / step_ms, np.nan)
        wait_share = np.where(nonzero, exposed_sync_wait_ms / step_ms, np.nan)
    row_replica = np.tile(replicas, count)
    frame = {
        "step": per_row(np.array([m.step for m in markers], dtype=np.int64), replica_count),
        "replica": row_replica,
        "device": [
            devices[replica] if devices and replica < len(devices) else None
            for replica in row_replica.tolist()
        ],
        "steps": per_row(steps, replica_count),
        "step_ms": step_ms,
        "compute_ms": compute * to_ms,
        "allreduce_ms": comm * to_ms,
        "sync_wait_ms": wait * to_ms,
        "transfer_ms": (comm - wait) * to_ms,
        "gather_ms": lengths["gather"] * to_ms,
        "gather_transfer_ms": (lengths["gather_or_wait"] - wait) * to_ms,
        "exposed_allreduce_ms": exposed_comm * to_ms,
        "exposed_sync_wait_ms": exposed_sync_wait_ms,
        "exposed_transfer_ms": exposed_transfer_ms,
        "input_ms": (busy_or_input - busy) * to_ms,
        "other_ms": other * to_ms,
        "dispatch_ms": row_dispatch * to_ms,
        "idle_ms": row_idle * to_ms,
        "scheduling_ms": (other - row_dispatch - row_idle) * to_ms,
        "comm_share": comm_share,
        "wait_share": wait_share,
        "reduce_transfer_ms": (lengths["reducing_or_wait"] - wait) * to_ms,
        "reduce_ms": lengths["reduce"] * to_ms,
    }
    blank = per_row(np.isin(np.arange(count), list(unmeasured)), replica_count)
    if blank.any():  # empty times give empty sizes and bandwidths below
        names = list(frame)
        for name in names[names.index("step_ms") :]:
            frame[name] = np.where(blank, np.nan, frame[name])
    # The all-reduce moves less in a step with gathers: the sparse gradients go there.
    reduce_bytes = facts.allreduce_bytes
    step_bytes = [
        reduce_bytes - facts.sparse_bytes
        if gathers and reduce_bytes and facts.sparse_bytes
        else reduce_bytes
        for gathers in has_gathers.tolist()
    ]
    row_bytes = [value for value in step_bytes for _ in range(replica_count)]
    frame.update(
        _sizes_and_bandwidths(
            frame,
            row_bytes,
            [facts.gather_bytes] * rows,
            [bool(value) for value in row_bytes],
            ranks,
            peak_gbps,
        )
    )
    for marker, note in unmeasured.items():
        first = marker * replica_count
        frame["bandwidth_note"][first : first + replica_count] = [note] * replica_count
    return pd.DataFrame(frame)[columns]


def _step_rows(
    replica_frame: pd.DataFrame,
    facts: RunFacts,
    peak_gbps: float | None = None,
    untrue_steps: Mapping[int, str] | None = None,
) -> pd.DataFrame:
    """One row per step. ``untrue_steps``: the note of each step number one of whose
    markers cannot be true; its row is empty but for that note."""
    if replica_frame.empty:
        return pd.DataFrame(columns=STEP_COLUMNS)
    grouped = replica_frame.groupby("step", sort=True)
    steps = grouped[[*_MEAN_COLUMNS, *_BANDWIDTH_TIMES]].mean()
    steps.insert(0, "step_ms", grouped["step_ms"].first())
    steps.insert(0, "steps", grouped["steps"].first())
    steps.insert(0, "replicas", grouped["replica"].nunique())
    steps["max_sync_wait_ms"] = grouped["sync_wait_ms"].max()
    # The replica the others waited for arrived last, so it waited least itself.
    measured = replica_frame.dropna(subset=["sync_wait_ms"])  # not the unmeasured steps
    waits = measured.groupby("step", sort=True)["sync_wait_ms"]
    straggler = measured.loc[waits.idxmin(), ["step", "replica"]].set_index("step")["replica"]
    steps["straggler_replica"] = straggler.reindex(steps.index).where(steps["max_sync_wait_ms"] > 0)
    # The step's bandwidth: its bytes over the replicas' mean all-reduce transfer time.
    times = {name: steps[name].to_numpy() for name in steps.columns}
    sizes = _sizes_and_bandwidths(
        times,
        _group_max(replica_frame, grouped, "allreduce_bytes"),
        _group_max(replica_frame, grouped, "gather_bytes"),
        [bool(facts.allreduce_bytes)] * len(steps),
        facts.group_size,
        peak_gbps,
    )
    for column, values in pd.DataFrame(sizes, index=steps.index).items():
        steps[column] = values
    # A step number may be marked more than once (tf_keras numbers steps within the
    # epoch): if one of its markers cannot be true, the row is empty too, as a mean of
    # the others would be shown as the step that ``Breakdown.unmeasured`` names.
    if untrue_steps:
        notes = pd.Series(untrue_steps, dtype=object)
        keep = ~steps.index.isin(notes.index)
        for name in steps.columns[steps.columns.get_loc("step_ms") :].drop("bandwidth_note"):
            steps[name] = steps[name].where(keep)  # an int column (bytes) turns float
        steps.loc[notes.index, "bandwidth_note"] = notes
    steps = steps.astype(dict.fromkeys(_BANDWIDTHS, float))
    steps["straggler_replica"] = steps["straggler_replica"].astype("Int64")
    return steps.reset_index()[STEP_COLUMNS]


def _group_max(frame: pd.DataFrame, grouped, column: str) -> list:
    """Per group, the largest value of a column of numbers or None, as Python values
    (None where the group has none); object columns are taken as integers."""
    values = frame[column]
    if values.dtype == object:
        if values.isna().all():
            return [None] * grouped.ngroups
        maxima = values.astype("Int64").groupby(frame["step"], sort=True).max()
        return [None if pd.isna(value) else int(value) for value in maxima.tolist()]
    return [None if pd.isna(value) else value for value in grouped[column].max().tolist()]


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
    release_memory: bool = False,
) -> Breakdown:
    """Breaks every marked step of a parsed XSpace down per replica.

    Every time column is per step: a marker that covers k steps
    (``steps_per_execution``) has its times divided by k (column ``steps``).

    Args:
        space: an ``XSpace`` proto (see ``xspace.load_xspace``).
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
        release_memory: hand the memory each stage frees back to the system as the
            analysis goes (glibc's ``malloc_trim``; no effect elsewhere), for a lower
            peak: 2.3-2.4x the file instead of 3.2x (1M synthetic events). For a
            process that does nothing else (the profiler's child analysis, the CLI);
            off by default, as trimming takes the heap's locks while other threads
            (training) allocate, and the pages they reuse fault back in.

    Returns:
        A ``Breakdown``; empty frames if the trace has no step markers.

    Raises:
        gpu_trace.UnusableTraceError: the replicas run on GPUs but a replica's GPU has
            no device events in the trace (the message says why).
    """
    release = _memory_release(release_memory)
    trace = _read_trace(space, replicas, devices, release)
    return _break_down(
        trace,
        release,
        devices=devices,
        allreduce_bytes=allreduce_bytes,
        group_size=group_size,
        sparse_bytes=sparse_bytes,
        gather_bytes=gather_bytes,
        steps_covered=steps_covered,
        link_peak_gbps=link_peak_gbps,
    )


@dataclass
class _Trace:
    """What the breakdown takes from a trace (the parsed XSpace can go once it is read).
    ``untrue``: why each marker that cannot be true is not, by index in ``markers``;
    those markers are held with no length (they take no spans; their rows stay empty).
    ``unchecked``: why the capture rule was not applied, where it would have mattered."""

    markers: list[StepMarker]
    spans: _Spans
    replica_count: int
    attribution: str | None
    on_gpu: bool
    untrue: dict[int, Untrue] = field(default_factory=dict)
    unchecked: str | None = None

    def take_spans(self) -> _Spans:
        """The spans, no longer held here: the breakdown frees them (the largest part
        of its memory) as soon as it has the steps' lengths, before building rows."""
        spans, self.spans = self.spans, None
        return spans


def _read_trace(
    space, replicas: int | None, devices: Sequence[str] | None, release_memory
) -> _Trace:
    columns = _SpanColumns(_origin_ps(space))
    # The strategy's devices choose the path; a CPU strategy ignores GPU planes.
    gpus = gpu_trace.read_replica_gpus(space, devices, columns.origin_ps)
    markers, launches, extent = _read_host(space, devices, columns, inputs_only=gpus is not None)
    untrue, unchecked = untrue_markers(markers, extent, capture_length_ps(space))
    if gpus is not None:
        # Linked by the markers as written: a launch inside an untrue marker goes to it
        # (and its row stays empty), not to another step.
        _add_gpu_spans(gpus, columns, launches, markers)
        replica_count = replicas or len(gpus.ordinals)
        del gpus  # the spans hold the events now
        spans = columns.build(release_memory)
        _sort_by_start(spans, release_memory)
        markers = _without_length(markers, untrue)
        return _Trace(markers, spans, replica_count, None, True, untrue, unchecked)
    spans = columns.build(release_memory)
    replica_count = replicas or _cpu_replica_count(spans)
    spans, attribution = _attribute_cpu_replicas(spans, replica_count)  # in trace order
    _sort_by_start(spans, release_memory)
    markers = _without_length(markers, untrue)
    return _Trace(markers, spans, replica_count, attribution, False, untrue, unchecked)


def _without_length(markers: list[StepMarker], untrue: Mapping[int, Untrue]) -> list[StepMarker]:
    """The markers, those in ``untrue`` ending where they start: they take no time and
    no spans from the steps beside them."""
    return [
        replace(marker, end_ps=marker.start_ps) if index in untrue else marker
        for index, marker in enumerate(markers)
    ]


def _break_down(
    trace: _Trace,
    release_memory: Callable[[], None],
    *,
    devices=None,
    allreduce_bytes=None,
    group_size=None,
    sparse_bytes=None,
    gather_bytes=None,
    steps_covered=None,
    link_peak_gbps=None,
) -> Breakdown:
    """``analyze_xspace`` on a trace already read."""
    if trace.on_gpu:
        link_peak_gbps = link_peak_gbps or gpu_trace.DEFAULT_GPU_PEAK_GBPS
    facts = RunFacts(
        allreduce_bytes=allreduce_bytes,
        sparse_bytes=sparse_bytes,
        gather_bytes=gather_bytes,
        steps_covered=dict(steps_covered or {}),
        group_size=group_size or trace.replica_count,
    )
    notes = {index: f"{_UNTRUE}{why.note}" for index, why in sorted(trace.untrue.items())}
    step_notes: dict[int, str] = {}  # by step number: its first untrue marker's note
    for index, note in notes.items():
        step_notes.setdefault(trace.markers[index].step, note)
    replica_frame = _replica_frame(
        trace.markers,
        trace.take_spans(),
        trace.replica_count,
        devices,
        facts,
        link_peak_gbps,
        release_memory,
        notes,
    )
    replica_frame = replica_frame.astype(dict.fromkeys(_BANDWIDTHS, float))
    steps = _step_rows(replica_frame, facts, link_peak_gbps, step_notes)
    # One line per rule, not per step: a window of untrue steps gives a short reason.
    steps_by_rule: dict[str, list[int]] = defaultdict(list)
    for index, why in sorted(trace.untrue.items()):
        steps_by_rule[why.rule].append(trace.markers[index].step)
    reasons = [summary(steps_by_rule) if steps_by_rule else None, trace.unchecked]
    return Breakdown(
        replica_frame[REPLICA_COLUMNS],
        steps,
        attribution=trace.attribution,
        unmeasured="; ".join(filter(None, reasons)) or None,
    )


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
    release_memory: bool = False,
    **facts,
) -> Breakdown:
    """``analyze_xspace`` on one ``.xplane.pb`` file.

    Args:
        facts: ``sparse_bytes``, ``gather_bytes``, ``steps_covered`` (see ``RunFacts``).
        xprof: add XProf's own per-step numbers (``XPROF_COLUMNS``, from its
            ``input_pipeline_analyzer``). None (default) does so for GPU traces only:
            on CPU-only traces XProf reports no device time.
        Others (``release_memory``: only where the analysis has its process to
        itself): see ``analyze_xspace``.
    """
    space = stream_xspace(path)  # lines are read one at a time, never all at once
    if xprof is None:
        xprof = bool(gpu_planes(space))
    release = _memory_release(release_memory)
    trace = _read_trace(space, replicas, devices, release)
    del space
    breakdown = _break_down(
        trace,
        release,
        devices=devices,
        allreduce_bytes=allreduce_bytes,
        group_size=group_size,
        link_peak_gbps=link_peak_gbps,
        **facts,
    )
    breakdown.source = str(path)
    if xprof and not breakdown.steps.empty and trace.untrue:
        # XProf groups the steps by the same markers: seen here, an untrue one merged
        # two steps into one of XProf's, which then paired with the wrong step of ours.
        breakdown.steps = breakdown.steps.assign(**dict.fromkeys(XPROF_COLUMNS, np.nan))
        breakdown.unmeasured += "; XProf's step numbers left out (it finds steps by the markers)"
    elif xprof and not breakdown.steps.empty:
        from keras_dp_tools.analysis.xprof_steps import xprof_step_table

        xprof_steps = _align_steps(xprof_step_table(Path(path)), breakdown.steps["step"])
        breakdown.steps = breakdown.steps.merge(xprof_steps, on="step", how="left")
    return breakdown


def _align_steps(xprof_steps: pd.DataFrame, steps: pd.Series) -> pd.DataFrame:
    """XProf names device steps by its own step groups (0, 1, ...) rather than the
    markers' ``step_num``; both list the steps in time order, so pair them by position
    when the numbers differ but the counts match (on GPU, XProf's 0, 1 would otherwise
    meet our steps 1, 2 one off). XProf's numbers that are all ours pair by number;
    otherwise (other numbers, another count: e.g. two profilers' crossing markers,
    which XProf may group apart) nothing pairs, and XProf's columns stay empty rather
    than meet the wrong steps."""
    if set(xprof_steps["step"]) <= set(steps):
        return xprof_steps
    if len(xprof_steps) != len(steps):
        return xprof_steps.iloc[0:0]
    return xprof_steps.assign(step=steps.sort_values().to_numpy())
