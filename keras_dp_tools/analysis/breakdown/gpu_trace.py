"""GPU traces as the TensorFlow profiler writes them, and what our breakdown takes from them.

The layout (XLA's CUPTI collector, ``xla/backends/profiler/gpu/cupti_collector.cc``):

* one plane ``/device:GPU:<n>`` per CUDA device ordinal ``n``; its CUPTI activity sits
  on lines ``Stream #<id>(<types>)``, e.g. ``Stream #13(Compute)`` or
  ``Stream #20(Compute,MemcpyD2D)``; other lines are derived views (XLA ops, steps,
  ``CUPTI overhead``) and are skipped;
* kernels are named by their demangled symbol (``void foo<...>(...)`` or
  ``ncclDevKernel_AllReduce_Sum_f32_RING_LL``); copies are ``MemcpyH2D``, ``MemcpyD2H``,
  ``MemcpyD2D`` (within one GPU), ``MemcpyP2P`` (between GPUs) or ``MemcpyOther``;
* every device event carries ``correlation_id``, ``context_id`` (a ``"$$<id>"``
  string), kernels ``kernel_details`` and copies ``memcpy_details`` (refs to strings);
* the host's CUDA API call that launched it (``cuLaunchKernel``, ``cuLaunchKernelEx``,
  ``cuMemcpyHtoDAsync_v2``, ...; CUPTI's driver callbacks) carries the same
  ``correlation_id`` and ``device_id``; after post-processing it sits on the
  ``/host:CPU`` plane, on the line of the thread that called it.

The host leaves a step marker (``train``) when it has launched the step's work; the GPU
often runs the last kernels (the optimizer's) after that. So a device event belongs to
the step whose marker encloses its launch; only events without that link fall back to
the time window of the marker.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from keras_dp_tools.analysis.breakdown.classify import KIND_CODES, Kind, classify_device_event
from keras_dp_tools.analysis.breakdown.device_roles import no_devices_apart, split_devices
from keras_dp_tools.analysis.trace.xevents import EventTable, read_events
from keras_dp_tools.analysis.trace.xspace import (
    StepMarker,
    TraceEvent,
    event_count,
    gpu_planes,
    named_stats,
    plane_events,
    whole_lines,
)
from keras_dp_tools.records.contract import gpu_ordinal

CORRELATION_STAT = "correlation_id"
GROUP_STAT = "group_id"  # XProf's step group, written into captures by older TensorFlow
TF_OP_STAT = "tf_op"
STREAM_LINE_PREFIX = "Stream #"
# Host CUDA API calls (driver ``cu*`` and runtime ``cuda*``) that start device work.
_CUDA_API_CALL = re.compile(r"^cu[A-Z]|^cuda[A-Z]")

# NCCL kernel name -> collective, first match wins (ReduceScatter before Reduce...).
_NCCL_COLLECTIVES = (
    ("all_reduce", re.compile(r"all_?reduce", re.IGNORECASE)),
    ("reduce_scatter", re.compile(r"reduce_?scatter", re.IGNORECASE)),
    ("all_gather", re.compile(r"all_?gather", re.IGNORECASE)),
    ("broadcast", re.compile(r"broadcast|bcast", re.IGNORECASE)),
    ("send_recv", re.compile(r"send_?recv|_send|_recv|alltoall", re.IGNORECASE)),
    ("reduce", re.compile(r"reduce", re.IGNORECASE)),
)

# Peak unidirectional bandwidth per GPU of each link kind, GB/s (1e9 bytes/s): a bus
# bandwidth above it cannot be transfer time alone. PCIe x16 per direction; NVLink all
# links of one GPU together (V100 6x25, A100 12x25, H100 18x25, B200 18x50).
LINK_PEAK_GBPS = {
    "pcie3": 16.0,
    "pcie4": 32.0,
    "pcie5": 64.0,
    "nvlink2": 150.0,
    "nvlink3": 300.0,
    "nvlink4": 450.0,
    "nvlink5": 900.0,
}
# Without a user-given peak, no GPU link can exceed the fastest one.
DEFAULT_GPU_PEAK_GBPS = max(LINK_PEAK_GBPS.values())


class UnusableTraceError(ValueError):
    """The trace cannot be broken down for the strategy's devices; the message says why
    and what to do. A profiler window whose trace raises it is marked failed."""


def nccl_collective(name: str) -> str | None:
    """The collective an NCCL kernel runs (``all_reduce``, ``reduce_scatter``,
    ``all_gather``, ``broadcast``, ``send_recv``, ``reduce``; ``other`` if the name does
    not say); None for kernels that are not NCCL's. "nccl" may sit anywhere in the name:
    demangled names can start with ``void ``."""
    if "nccl" not in name.lower():
        return None
    for collective, pattern in _NCCL_COLLECTIVES:
        if pattern.search(name):
            return collective
    return "other"


def is_cuda_api_call(name: str) -> bool:
    """Whether a host event of this name is a CUDA API call that starts device work."""
    return _CUDA_API_CALL.match(name) is not None


def is_stream_line(line) -> bool:
    """Whether an ``XLine`` of a GPU plane holds CUPTI activity: a ``Stream #`` line
    with events."""
    return bool(event_count(line)) and (line.display_name or line.name).startswith(
        STREAM_LINE_PREFIX
    )


def stream_events(plane) -> list[TraceEvent]:
    """The CUPTI activity of a GPU plane: events on its ``Stream #`` lines."""
    return list(plane_events(plane, [line for line in plane.lines if is_stream_line(line)]))


def _has_stream_events(plane) -> bool:
    """``bool(stream_events(plane))`` without reading the events."""
    return any(is_stream_line(line) for line in plane.lines)


@dataclass(slots=True)
class DeviceEvents:
    """The kernels and copies of one GPU's stream lines as arrays, in trace order (line
    by line, each line's events in order).

    ``kind``: index in ``list(Kind)``; ``start``, ``end``: picoseconds from the origin
    the reader was given; ``correlation``: the ``correlation_id`` linking each event to
    its host launch (-1: none); ``reducing``: False for NCCL kernels of collectives
    other than all-reduce (they do not count towards the all-reduce bandwidth);
    ``group``: the ``group_id`` a capture grouped before saving gave the event (XProf's
    step group; -1: none).
    """

    kind: np.ndarray
    start: np.ndarray
    end: np.ndarray
    correlation: np.ndarray
    reducing: np.ndarray
    group: np.ndarray


@dataclass(slots=True)
class ReplicaGpus:
    """The GPUs of a GPU run: ``ordinals[k]`` is replica k's CUDA ordinal, ``events[k]``
    its device events; ``apart``: the GPUs of the trace that are not replicas and what
    they did (``device_roles.DEVICES_APART_COLUMNS``), when the run's devices are not
    known."""

    ordinals: list[int]
    events: list[DeviceEvents]
    apart: pd.DataFrame = field(default_factory=no_devices_apart)


def read_replica_gpus(space, devices: Sequence[str] | None, origin_ps: int) -> ReplicaGpus | None:
    """The device events of each replica's GPU, each GPU plane read once; None for a
    CPU-device run.

    With the strategy's ``devices``, their kind decides: CPU devices take the CPU path
    even when the trace also has GPU planes (a CPU strategy on a GPU machine; the GPU
    planes are then not read). Without them, GPU planes that hold device events mean a
    GPU run, one replica per GPU that ran the model's kernels; the others (only copies,
    or nothing) are listed apart (``device_roles.split_devices``).

    Raises:
        UnusableTraceError: a replica's GPU has no device events in the trace (no
            CUPTI, or TensorFlow's GPU ids differ from the CUDA ordinals the planes are
            named by), or the devices mix GPUs and CPUs.
    """
    ordinals = [gpu_ordinal(device) for device in devices or ()]
    if ordinals and all(ordinal is None for ordinal in ordinals):
        return None
    if None in ordinals:
        raise UnusableTraceError(
            f"The strategy's devices mix GPUs and other devices ({list(devices)}); only "
            "all-GPU or all-CPU replicas can be broken down."
        )
    planes = gpu_planes(space)
    read = {
        ordinal: read_device_events(planes[ordinal], origin_ps)
        for ordinal in ordinals or planes
        if ordinal in planes
    }
    busy = {ordinal for ordinal, events in read.items() if len(events.kind)}
    if not ordinals:
        ordinals, apart = split_devices(read)
        if not ordinals:
            return None
        return ReplicaGpus(ordinals, [read[ordinal] for ordinal in ordinals], apart)
    idle = [ordinal for ordinal in ordinals if ordinal not in busy]
    if idle:  # the reason names the planes that do hold events: read those (error path)
        busy |= {o for o, plane in planes.items() if o not in read and _has_stream_events(plane)}
        raise UnusableTraceError(_missing_events_reason(ordinals, idle, planes, busy))
    return ReplicaGpus(ordinals, [read[ordinal] for ordinal in ordinals])


def _missing_events_reason(ordinals, idle, planes, busy) -> str:
    asked = ", ".join(f"GPU:{ordinal}" for ordinal in ordinals)
    missing = ", ".join(f"GPU:{ordinal}" for ordinal in idle)
    if not planes:
        return (
            f"The trace has no GPU planes although the replicas run on {asked}: the profiler "
            "recorded no device events. Is CUPTI loadable (libcupti.so on LD_LIBRARY_PATH; "
            "`keras-dp doctor` checks)?"
        )
    others = sorted(busy - set(ordinals))
    if others:
        return (
            f"No device events on {missing} (the replicas' devices), but on "
            f"{', '.join(f'GPU:{o}' for o in others)}: TensorFlow's GPU ids differ from "
            "the CUDA ordinals the trace is named by (tf.config.set_visible_devices hides "
            "GPUs from TensorFlow only). Use CUDA_VISIBLE_DEVICES to choose GPUs instead."
        )
    if not busy:
        return (
            f"The GPU planes of the trace hold no device events (replicas on {asked}): "
            "CUPTI recorded nothing. Another CUPTI client (Nsight, a second profiler) or "
            "missing permission for GPU counters can cause this; `keras-dp doctor` checks."
        )
    return (
        f"No device events on {missing} while the other replicas' GPUs have some: the "
        "profiler lost that GPU's activity, so its steps cannot be compared."
    )


# An event's own ``tf_op`` (kinds of op key): none, a ref to a stat metadata, a string.
_NO_OP, _OP_REF, _OP_STRING = 0, 1, 2
_BATCH_BYTES = 1 << 23  # serialised lines read at once (~150k device events)


def event_times(base, offset_ps: np.ndarray, duration_ps: np.ndarray, place):
    """Starts and ends (int64 picoseconds) of events at ``offset_ps`` from their line's
    ``base`` (a number or one per event) lasting ``duration_ps``.

    Raises:
        UnusableTraceError: an event's time does not fit int64 (numpy would wrap it
            silently); ``place`` names the events' plane and line (a function of an
            event's index where they vary).
    """
    start = base + offset_ps
    end = start + duration_ps
    # A sum wrapped iff both terms have the sign its result lacks.
    wrapped = (((base ^ start) & (offset_ps ^ start)) | ((start ^ end) & (duration_ps ^ end))) < 0
    if wrapped.any():
        first = int(np.argmax(wrapped))
        where = place(first) if callable(place) else place
        raise UnusableTraceError(
            f"An event on {where} (offset_ps {int(offset_ps[first])}, duration_ps "
            f"{int(duration_ps[first])}) lies beyond the 2**63 ps (~106 days) a trace's "
            "times can span: the trace is damaged or not written by TensorFlow's "
            "profiler. Capture the window again; if it recurs, report the trace."
        )
    return start, end


def stat_ids(stat_names: dict[int, str], name: str) -> np.ndarray:
    """The stat metadata ids named ``name``: all of them, as a stat counts by its name
    (as in ``named_stats``), should a plane define a name twice."""
    return np.array([key for key, known in stat_names.items() if known == name], np.int64)


@dataclass(frozen=True, slots=True)
class PlaneCorrelation:
    """Where the events of a plane find their ``correlation_id``: their own stats of
    that name (``stat_ids``) and, for events without one, their event metadata's
    (``by_metadata``, metadata id -> id), as ``plane_events`` merges the two."""

    stat_ids: np.ndarray
    by_metadata: dict[int, int]

    @classmethod
    def of(cls, plane, metadata_ids=None, stat: str = CORRELATION_STAT) -> PlaneCorrelation:
        """The plane's rule; event metadata limited to ``metadata_ids`` if given.
        ``stat``: another integer stat read the same way (``group_id``)."""
        stat_names = {key: meta.name for key, meta in plane.stat_metadata.items()}
        ids = stat_ids(stat_names, stat)
        wanted = set(ids.tolist())
        keys = plane.event_metadata.keys() if metadata_ids is None else metadata_ids
        by_metadata = {}
        for key in keys:
            meta = plane.event_metadata.get(key)
            for stat in meta.stats if meta is not None and wanted else ():
                kind = stat.WhichOneof("value")
                if stat.metadata_id in wanted and kind in ("uint64_value", "int64_value"):
                    value = getattr(stat, kind)  # the last one wins; as int64 bits:
                    by_metadata[key] = value - (1 << 64) if value >= 1 << 63 else value
        return cls(ids, by_metadata)

    def ids(self, table: EventTable) -> np.ndarray:
        """Each event's ``correlation_id`` (-1: none; CUPTI writes it as uint64, an
        int64 one is read too); an event's later stat wins, as in a dict of its stats."""
        correlation = np.full(len(table.metadata_id), -1, dtype=np.int64)
        found = np.flatnonzero(np.isin(table.stat_metadata_id, self.stat_ids))
        unsigned, signed = table.has_uint64[found], table.has_int64[found]
        value = np.where(unsigned, table.uint64_value[found], table.int64_value[found])
        valid = unsigned | signed
        correlation[table.event[found[valid]]] = value[valid]
        if not self.by_metadata:
            return correlation
        keys = np.array(sorted(self.by_metadata), dtype=np.int64)
        values = np.array([self.by_metadata[key] for key in keys.tolist()], dtype=np.int64)
        index = np.minimum(np.searchsorted(keys, table.metadata_id), len(keys) - 1)
        inherit = (correlation < 0) & (keys[index] == table.metadata_id)
        return np.where(inherit, values[index], correlation)


class _PlaneReader:
    """Reads the stream lines of one GPU plane into arrays. Events and their stats are
    decoded by ``xevents`` (numpy over the wire format); kinds are decided once per
    (event metadata, ``tf_op`` value) pair, never per event."""

    def __init__(self, plane, origin_ps: int):
        self.origin_ps = origin_ps
        self.plane_name = plane.name
        self.stat_names = {key: meta.name for key, meta in plane.stat_metadata.items()}
        self.correlation = PlaneCorrelation.of(plane)
        self.group = PlaneCorrelation.of(plane, stat=GROUP_STAT)
        self.op_ids = stat_ids(self.stat_names, TF_OP_STAT)
        self.metadata = {
            key: (meta.name, named_stats(meta.stats, self.stat_names))
            for key, meta in plane.event_metadata.items()
        }
        self.op_strings: dict[str, int] = {}  # tf_op given as a string, not a ref
        self.roles: dict[tuple[int, int, int], tuple[int, bool]] = {}

    def read(self, lines) -> DeviceEvents:
        """The events of the stream lines among ``lines``, read in batches of about
        ``_BATCH_BYTES`` of serialised lines (numpy's per-call cost is then small)."""
        parts, batch, bases, names, size = [], [], [], [], 0
        for line in lines:
            if not is_stream_line(line):
                continue
            # A whole line of a streamed plane has its events parsed as bytes already.
            batch.append(line if hasattr(line, "event_bytes") else line.SerializeToString())
            bases.append(line.timestamp_ns * 1000 - self.origin_ps)
            names.append(line.display_name or line.name)
            size += len(line.SerializeToString())  # a LinePiece's: the bytes read
            if size >= _BATCH_BYTES:
                parts.append(self._batch(batch, bases, names))
                batch, bases, names, size = [], [], [], 0
        if batch:
            parts.append(self._batch(batch, bases, names))
        if not parts:
            empty = np.empty(0, np.int64)
            return DeviceEvents(np.empty(0, np.int8), empty, empty, empty, np.empty(0, bool), empty)
        return DeviceEvents(*(np.concatenate(column) for column in zip(*parts, strict=True)))

    def _batch(self, lines: list[bytes], bases: list[int], names: list[str]):
        table, line_of = read_events(lines)
        start, end = event_times(
            np.array(bases, dtype=np.int64)[line_of],
            table.offset_ps,
            table.duration_ps,
            lambda i: f"plane {self.plane_name}, line {names[line_of[i]]!r}",
        )
        correlation = self.correlation.ids(table)
        kind, reducing = self._kinds(table.metadata_id, *self._ops(table))
        return kind, start, end, correlation, reducing, self.group.ids(table)

    def _ops(self, table: EventTable) -> tuple[np.ndarray, np.ndarray]:
        """Per event its own ``tf_op``: its kind (``_NO_OP``, ``_OP_REF``,
        ``_OP_STRING``) and value (the ref's stat metadata id as int64 bits, or the
        index of the string in ``op_strings``)."""
        kind = np.full(len(table.metadata_id), _NO_OP, dtype=np.int64)
        value = np.zeros(len(table.metadata_id), dtype=np.int64)
        found = np.flatnonzero(np.isin(table.stat_metadata_id, self.op_ids))
        key = table.ref_value[found].copy()
        for i in np.flatnonzero(~table.has_ref[found]).tolist():  # a string (rare)
            text = table.text(int(found[i])) or ""
            key[i] = self.op_strings.setdefault(text, len(self.op_strings))
        kind[table.event[found]] = np.where(table.has_ref[found], _OP_REF, _OP_STRING)
        value[table.event[found]] = key
        return kind, value

    def _kinds(self, metadata_ids: np.ndarray, op_kind: np.ndarray, op_value: np.ndarray):
        """Kind codes and the reducing flag per event, from its (metadata, tf_op) pair."""
        if (
            len(metadata_ids)
            and min(metadata_ids.min(), op_value.min()) >= 0
            and metadata_ids.max() < 1 << 31
            and op_value.max() < 1 << 30
        ):
            # One integer per (metadata, op kind, op value): a fast unique.
            triple = metadata_ids << 32 | op_kind << 30 | op_value
            unique, inverse = np.unique(triple, return_inverse=True)
            triples = zip(
                (unique >> 32).tolist(),
                ((unique >> 30) & 3).tolist(),
                (unique & ((1 << 30) - 1)).tolist(),
                strict=True,
            )
        else:
            stacked = np.stack([metadata_ids, op_kind, op_value])
            unique, inverse = np.unique(stacked, axis=1, return_inverse=True)
            triples = unique.T.tolist()
        roles = [self._role(*triple) for triple in triples]
        kind = np.array([role[0] for role in roles], dtype=np.int8)
        reducing = np.array([role[1] for role in roles], dtype=bool)
        inverse = inverse.reshape(-1)
        return kind[inverse], reducing[inverse]

    def _role(self, metadata_id: int, op_kind: int, op_value: int) -> tuple[int, bool]:
        role = self.roles.get((metadata_id, op_kind, op_value))
        if role is None:
            name, stats = self.metadata.get(metadata_id, ("", {}))
            if op_kind == _OP_REF:
                stats = {**stats, TF_OP_STAT: self.stat_names.get(op_value)}
            elif op_kind == _OP_STRING:
                stats = {**stats, TF_OP_STAT: list(self.op_strings)[op_value]}
            collective = nccl_collective(name)
            # An all-gather is accounted apart from the all-reduce, as on CPU traces.
            event = TraceEvent(self.plane_name, "", name, 0, 0, stats)
            kind = Kind.GATHER if collective == "all_gather" else classify_device_event(event)
            role = KIND_CODES[kind], collective in (None, "all_reduce")
            self.roles[(metadata_id, op_kind, op_value)] = role
        return role


def read_device_events(plane, origin_ps: int) -> DeviceEvents:
    """The kernels and copies on a GPU plane's ``Stream #`` lines, read once, as arrays
    (times in picoseconds from ``origin_ps``)."""
    return _PlaneReader(plane, origin_ps).read(whole_lines(plane))


def read_launches(
    table: EventTable, indices: np.ndarray, starts: np.ndarray, correlation: PlaneCorrelation
):
    """(correlation ids, starts) of the host CUDA calls at ``indices`` of a line's
    events (``table``: the line's, with at least the launches' stats; ``starts``: every
    event's start) that carry a ``correlation_id`` (found as ``correlation``, the
    plane's ``PlaneCorrelation``, says), as arrays."""
    correlation = correlation.ids(table)[indices]
    linked = correlation >= 0
    return correlation[linked], starts[indices][linked]


def launch_links(launches, markers: Sequence[StepMarker], origin_ps: int):
    """(correlation ids sorted, index of the marker enclosing each one's launch) for the
    host CUDA calls ``launches`` (``read_launches``' arrays, line by line) that run
    inside a step marker. Markers do not overlap (``step_markers`` keeps one set); a
    correlation id launched twice keeps its last launch."""
    correlation = np.concatenate([ids for ids, _ in launches] or [np.empty(0, np.int64)])
    at = np.concatenate([starts for _, starts in launches] or [np.empty(0, np.int64)])
    starts = np.array([marker.start_ps - origin_ps for marker in markers], dtype=np.int64)
    ends = np.array([marker.end_ps - origin_ps for marker in markers], dtype=np.int64)
    index = np.searchsorted(starts, at, side="right") - 1
    inside = index >= 0
    inside[inside] = at[inside] < ends[index[inside]]
    correlation, index = correlation[inside][::-1], index[inside][::-1]
    ids, last = np.unique(correlation, return_index=True)  # first of reversed: last launch
    return ids, index[last]


def grouped_markers(group: np.ndarray, markers: Sequence[StepMarker]) -> np.ndarray:
    """Per device event, the index of the marker of its ``group_id`` (-1: none), for
    steps found by ``group_id`` (``step_sources``: a marker's ``step`` is its group)."""
    ids = np.array([marker.step for marker in markers], dtype=np.int64)
    if not len(ids):
        return np.full(len(group), -1, dtype=np.int64)
    order = np.argsort(ids, kind="stable")
    position = np.minimum(np.searchsorted(ids[order], group), len(ids) - 1)
    found = (ids[order][position] == group) & (group >= 0)
    return np.where(found, order[position], -1)


def launching_markers(correlation: np.ndarray, links) -> np.ndarray:
    """Per device event, the index of the marker that launched it (-1: none), from
    ``launch_links``."""
    ids, marker = links
    if not len(ids):
        return np.full(len(correlation), -1, dtype=np.int64)
    position = np.minimum(np.searchsorted(ids, correlation), len(ids) - 1)
    linked = (ids[position] == correlation) & (correlation >= 0)
    return np.where(linked, marker[position], -1)


def check_bandwidth(busbw_gbps: float | None, peak_gbps: float | None) -> str | None:
    """Why a bus bandwidth cannot be shown (above the link's physical peak), or None."""
    if busbw_gbps is None or peak_gbps is None or busbw_gbps <= peak_gbps:
        return None
    return (
        f"bus bandwidth {busbw_gbps:.0f} GB/s exceeds the link peak {peak_gbps:.0f} GB/s: "
        "the collectives' time is not transfer alone (not shown)"
    )
