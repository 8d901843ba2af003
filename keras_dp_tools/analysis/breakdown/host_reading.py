"""Reading the host planes of a trace into spans: one pass, line by line, as arrays.

Events are classified once per event metadata (``classify``); only the events whose
stats matter (collectives, step markers, CUDA launches) are read one by one.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence

import numpy as np

from keras_dp_tools.analysis.breakdown import gpu_trace
from keras_dp_tools.analysis.breakdown.classify import (
    KIND_CODES,
    PEER_KINDS,
    PER_REPLICA_COPY_TYPES,
    Kind,
    classify_host_name,
    receiving_device,
    scoped_replica,
)
from keras_dp_tools.analysis.breakdown.spans import NO_REPLICA, SpanColumns
from keras_dp_tools.analysis.breakdown.step_sources import (
    MARKER_NAMES,
    ROOT_NAMES,
    ROOT_STATS,
    TraceSteps,
    find_steps,
)
from keras_dp_tools.analysis.trace.xevents import read_line_events
from keras_dp_tools.analysis.trace.xspace import (
    TraceEvent,
    event_count,
    gpu_planes,
    host_planes,
    line_timestamps,
    named_stats,
    whole_lines,
)

# Kinds as small integers, for the span columns.
_KINDS = list(Kind)
_CODE = KIND_CODES
# Host events read for their stats, not as spans: step markers, CUDA launches, and the
# executor's events XProf groups steps by (read where a plane has no markers).
_MARKER, _LAUNCH, _ROOT = "marker", "launch", "root"


def _peer_key(stats) -> tuple | None:
    """What identifies one collective across replicas. Seen in TF 2.21 captures: the k
    all-reduces of a ``steps_per_execution=k`` call share ``instance_key``, ``group_key``,
    ``step_id`` and ``frame_id`` and differ only in ``iter_id`` (0..k-1)."""
    get = stats.get
    if get("instance_key") is None:
        return None
    return get("group_key"), get("instance_key"), get("step_id"), get("frame_id"), get("iter_id")


# Relative picoseconds must fit int64 (~106 days) with room for the events' offsets.
_MAX_SPREAD_PS = 1 << 62


def origin_ps(space) -> int:
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
    metadata: None (skip), (_MARKER | _LAUNCH | _ROOT,) or (kind, replica, needs_stats,
    copied)."""
    if name in MARKER_NAMES:
        return (_MARKER,)
    if name in ROOT_NAMES:
        return (_ROOT,)
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


def read_host(
    space, devices, columns: SpanColumns, inputs_only: bool
) -> tuple[TraceSteps, list, tuple | None]:
    """One pass over the host planes: the spans of classified events (into ``columns``;
    only input waits if ``inputs_only``), the steps (``step_sources.find_steps``: from
    the step markers, else the executor's events), the CUDA launches as arrays
    (``gpu_trace.read_launches``) and the host events' extent: the earliest start of
    any and the latest end of one that is not a step marker (absolute picoseconds;
    None: no events). Events are classified by their metadata, once, and read line by
    line into arrays; only the events whose stats matter (collectives, markers, and
    the executor's events where a plane has no markers) are read one by one."""
    markers, roots, launches = [], [], []
    origin = columns.origin_ps
    earliest = latest_other = None  # from the origin
    for plane in host_planes(space):
        stat_names = {key: meta.name for key, meta in plane.stat_metadata.items()}
        root_stat_names = {key: name for key, name in stat_names.items() if name in ROOT_STATS}
        plain, special = {}, {}  # by metadata id: spans without and with stats to read
        for key, meta in plane.event_metadata.items():
            role = _host_metadata(meta.name, inputs_only)
            if role is None:
                continue
            if len(role) == 4 and not role[2]:
                replica = NO_REPLICA if role[1] is None else role[1]
                plain[key] = (role[0], replica, meta.name if role[3] else "")
            else:
                special[key] = (role, meta.name, named_stats(meta.stats, stat_names))
        roles = _PlainRoles(plain)
        if any(value[0][0] == _MARKER for value in special.values()):
            # The executor's events matter only without step markers (step_sources).
            special = {k: v for k, v in special.items() if v[0][0] != _ROOT}
        special_ids = np.array(sorted(special), dtype=np.int64)
        # CUDA launches (one per kernel) are read as arrays (gpu_trace.read_launches).
        launch_ids = np.array([k for k, v in special.items() if v[0][0] == _LAUNCH], np.int64)
        marker_ids = np.array([k for k, v in special.items() if v[0][0] == _MARKER], np.int64)
        correlation = gpu_trace.PlaneCorrelation.of(plane, launch_ids.tolist())
        # A GPU trace's lines are decoded from their bytes (xevents): read whole.
        for line in whole_lines(plane) if len(launch_ids) else plane.lines:
            if not event_count(line):
                continue
            line_name = line.display_name or line.name
            off_python = line_name != "python"  # eager ops and tracing: host overhead
            base = line.timestamp_ns * 1000 - origin
            if len(launch_ids):  # a GPU trace: read as arrays, with the launches' stats
                table = read_line_events(line, stats_of=launch_ids)
                events = np.stack([table.metadata_id, table.offset_ps, table.duration_ps], 1)
            else:
                table, events = None, _event_columns(line.events)
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
                        table, np.flatnonzero(launched), base + events[:, 1], correlation
                    )
                )
            for index in np.flatnonzero(np.isin(metadata_ids, special_ids) & ~launched).tolist():
                role, name, meta_stats = special[int(metadata_ids[index])]
                if len(role) == 4 and not off_python:
                    continue
                event = line.events[index]
                stats = meta_stats
                if event.stats and role[0] == _ROOT:  # many: only the stats steps need
                    stats = {**meta_stats, **_picked_stats(event.stats, root_stat_names)}
                elif event.stats:
                    stats = {**meta_stats, **named_stats(event.stats, stat_names)}
                start = base + origin + event.offset_ps
                end = start + event.duration_ps
                traced = TraceEvent(plane.name, line_name, name, start, end, stats, line.id)
                if role[0] == _MARKER:
                    markers.append(traced)
                elif role[0] == _ROOT:
                    roots.append(traced)
                else:
                    rows.append((index, _host_span(role, traced, devices, origin)))
            if off_python:
                _extend_line(columns, roles, events, base, rows)
    if earliest is None:
        return find_steps(markers, roots, None), launches, None
    extent = origin + earliest, None if latest_other is None else origin + latest_other
    return find_steps(markers, roots, extent), launches, extent


def _picked_stats(stats, wanted: dict[int, str]) -> dict[str, object]:
    """The stats of ``stats`` whose metadata ``wanted`` names (integers or strings:
    a reference is not resolved), by name; the last of one name wins."""
    picked = {}
    for stat in stats:
        name = wanted.get(stat.metadata_id)
        if name is not None:
            kind = stat.WhichOneof("value")
            picked[name] = None if kind is None else getattr(stat, kind)
    return picked


def _extend_line(columns: SpanColumns, roles: _PlainRoles, events, base: int, rows) -> None:
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
    replica = NO_REPLICA if replica is None else replica
    name = event.name if copied else ""
    return kind_code, replica, event.start_ps - origin, event.end_ps - origin, key, name


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
