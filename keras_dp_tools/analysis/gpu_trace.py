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

import itertools
import operator
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from keras_dp_tools.analysis.classify import Kind, classify_device_event
from keras_dp_tools.analysis.xspace import (
    StepMarker,
    TraceEvent,
    _stats,
    gpu_planes,
    plane_events,
)
from keras_dp_tools.contract import gpu_ordinal

CORRELATION_STAT = "correlation_id"
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


def stream_events(plane) -> list[TraceEvent]:
    """The CUPTI activity of a GPU plane: events on its ``Stream #`` lines."""
    return [event for event in plane_events(plane) if event.line.startswith(STREAM_LINE_PREFIX)]


def _has_stream_events(plane) -> bool:
    """``bool(stream_events(plane))`` without reading the events."""
    return any(
        len(line.events) and (line.display_name or line.name).startswith(STREAM_LINE_PREFIX)
        for line in plane.lines
    )


@dataclass(slots=True)
class DeviceEvents:
    """The kernels and copies of one GPU's stream lines as arrays, in trace order (line
    by line, each line's events in order).

    ``kind``: index in ``list(Kind)``; ``start``, ``end``: picoseconds from the origin
    the reader was given; ``correlation``: the ``correlation_id`` linking each event to
    its host launch (-1: none); ``reducing``: False for NCCL kernels of collectives
    other than all-reduce (they do not count towards the all-reduce bandwidth).
    """

    kind: np.ndarray
    start: np.ndarray
    end: np.ndarray
    correlation: np.ndarray
    reducing: np.ndarray


@dataclass(slots=True)
class ReplicaGpus:
    """The GPUs of a GPU run: ``ordinals[k]`` is replica k's CUDA ordinal, ``events[k]``
    its device events."""

    ordinals: list[int]
    events: list[DeviceEvents]


def read_replica_gpus(space, devices: Sequence[str] | None, origin_ps: int) -> ReplicaGpus | None:
    """The device events of each replica's GPU, each GPU plane read once; None for a
    CPU-device run.

    With the strategy's ``devices``, their kind decides: CPU devices take the CPU path
    even when the trace also has GPU planes (a CPU strategy on a GPU machine; the GPU
    planes are then not read). Without them, GPU planes that hold device events mean a
    GPU run, one replica per such plane.

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
        ordinals = sorted(busy)
        if not ordinals:
            return None
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


_KIND_CODE = {kind: code for code, kind in enumerate(Kind)}
_EVENT_FIELDS = operator.attrgetter("metadata_id", "offset_ps", "duration_ps")
_STATS = operator.attrgetter("stats")
# A stat's id and the fields ids are kept in (unset ones read 0); the others (strings,
# signed ids) are read stat by stat where these say nothing.
_STAT_FIELDS = operator.attrgetter("metadata_id", "ref_value", "uint64_value")
_NO_OP = -1  # an event without a tf_op stat of its own


def stat_table(events, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The stats of ``count`` events as arrays: each stat's event (by position) and an
    (n, 3) array of its metadata id, ``ref_value`` and ``uint64_value`` (0 when unset).
    The attribute reads run in C (``map``); no stat becomes a dict."""
    sizes = np.fromiter(map(len, map(_STATS, events)), np.int64, count)
    total = int(sizes.sum())

    def flat():
        stats = itertools.chain.from_iterable(map(_STATS, events))
        return itertools.chain.from_iterable(map(_STAT_FIELDS, stats))

    try:
        fields = np.fromiter(flat(), np.int64, 3 * total)
    except OverflowError:  # a uint64 above 2**63 (not an id): kept as its bits
        fields = np.fromiter(flat(), np.uint64, 3 * total).view(np.int64)
    return np.repeat(np.arange(count), sizes), fields.reshape(-1, 3)


def _stat_at(events, owner: np.ndarray, index: int):
    """The ``index``-th stat of ``stat_table``'s rows, as a message."""
    event = int(owner[index])
    first = int(np.searchsorted(owner, event))  # owner is sorted: the event's first stat
    return events[event].stats[index - first]


def correlation_ids(events, owner, fields, stat_id: int, count: int) -> np.ndarray:
    """Each event's ``correlation_id`` (-1: none; CUPTI writes it as uint64, an int64
    one is read too) from ``stat_table``'s arrays; an event's later stat wins, as in a
    dict of its stats."""
    correlation = np.full(count, -1, dtype=np.int64)
    found = np.flatnonzero(fields[:, 0] == stat_id)
    if len(found):
        value = fields[found, 2].copy()
        for i in np.flatnonzero(value == 0).tolist():  # unset as uint64 (rare)
            value[i] = _stat_at(events, owner, int(found[i])).int64_value
        correlation[owner[found]] = value
    return correlation


class _PlaneReader:
    """Reads the stream lines of one GPU plane into arrays. Kinds are decided once per
    (event metadata, ``tf_op`` value) pair, never per event; the per-event work is the
    attribute reads of the events and their stats, run in C by ``map``."""

    def __init__(self, plane, origin_ps: int):
        self.origin_ps = origin_ps
        self.plane_name = plane.name
        self.stat_names = {key: meta.name for key, meta in plane.stat_metadata.items()}
        ids = {name: key for key, name in self.stat_names.items()}
        # -2 never matches a stat id (ids are >= 0).
        self.correlation_id = ids.get(CORRELATION_STAT, -2)
        self.op_id = ids.get(TF_OP_STAT, -2)
        self.metadata = {
            key: (meta.name, _stats(meta.stats, self.stat_names))
            for key, meta in plane.event_metadata.items()
        }
        self.op_strings: dict[str, int] = {}  # tf_op given as a string, not a ref
        self.roles: dict[tuple[int, int], tuple[int, bool]] = {}

    def read(self, lines) -> DeviceEvents:
        parts = [self._line(line) for line in lines]
        parts = [part for part in parts if part is not None]
        if not parts:
            empty = np.empty(0, np.int64)
            return DeviceEvents(np.empty(0, np.int8), empty, empty, empty, np.empty(0, bool))
        return DeviceEvents(*(np.concatenate(column) for column in zip(*parts, strict=True)))

    def _line(self, line):
        events = line.events
        count = len(events)
        if not count or not (line.display_name or line.name).startswith(STREAM_LINE_PREFIX):
            return None
        base = line.timestamp_ns * 1000 - self.origin_ps
        columns = np.fromiter(
            itertools.chain.from_iterable(map(_EVENT_FIELDS, events)), np.int64, 3 * count
        ).reshape(-1, 3)
        start = base + columns[:, 1]
        end = start + columns[:, 2]
        correlation, op = self._stat_columns(events, count)
        kind, reducing = self._kinds(columns[:, 0], op)
        metadata_correlation = self._metadata_correlation(columns[:, 0], correlation)
        if metadata_correlation is not None:
            correlation = metadata_correlation
        return kind, start, end, correlation, reducing

    def _stat_columns(self, events, count: int):
        """Per event: its ``correlation_id`` (-1: none) and its own ``tf_op`` as a key
        (a stat metadata id for a ref, ``-2 - k`` for the k-th string; -1: none)."""
        owner, fields = stat_table(events, count)
        correlation = correlation_ids(events, owner, fields, self.correlation_id, count)
        op = np.full(count, _NO_OP, dtype=np.int64)
        found = np.flatnonzero(fields[:, 0] == self.op_id)
        if len(found):
            key = fields[found, 1]
            for i in np.flatnonzero(key == 0).tolist():  # a string, not a ref (rare)
                text = _stat_at(events, owner, int(found[i])).str_value
                key[i] = -2 - self.op_strings.setdefault(text, len(self.op_strings))
            op[owner[found]] = key
        return correlation, op

    def _kinds(self, metadata_ids: np.ndarray, op: np.ndarray):
        """Kind codes and the reducing flag per event, from its (metadata, tf_op) pair."""
        if (
            len(metadata_ids)
            and max(metadata_ids.max(), op.max()) < 1 << 31
            and op.min() > -(1 << 31)
        ):
            pair = metadata_ids << 32 | (op + (1 << 31))  # one integer per pair: a fast unique
            unique, inverse = np.unique(pair, return_inverse=True)
            low = (unique & 0xFFFFFFFF) - (1 << 31)
            pairs = zip((unique >> 32).tolist(), low.tolist(), strict=True)
        else:
            unique, inverse = np.unique(np.stack([metadata_ids, op]), axis=1, return_inverse=True)
            pairs = unique.T.tolist()
        roles = [self._role(meta, key) for meta, key in pairs]
        kind = np.array([role[0] for role in roles], dtype=np.int8)
        reducing = np.array([role[1] for role in roles], dtype=bool)
        inverse = inverse.reshape(-1)
        return kind[inverse], reducing[inverse]

    def _role(self, metadata_id: int, op_key: int) -> tuple[int, bool]:
        role = self.roles.get((metadata_id, op_key))
        if role is None:
            name, stats = self.metadata.get(metadata_id, ("", {}))
            if op_key != _NO_OP:
                strings = list(self.op_strings)
                value = self.stat_names.get(op_key) if op_key >= 0 else strings[-2 - op_key]
                stats = {**stats, TF_OP_STAT: value}
            collective = nccl_collective(name)
            # An all-gather is accounted apart from the all-reduce, as on CPU traces.
            event = TraceEvent(self.plane_name, "", name, 0, 0, stats)
            kind = Kind.GATHER if collective == "all_gather" else classify_device_event(event)
            role = _KIND_CODE[kind], collective in (None, "all_reduce")
            self.roles[(metadata_id, op_key)] = role
        return role

    def _metadata_correlation(self, metadata_ids: np.ndarray, correlation: np.ndarray):
        """``correlation`` with the ids event metadata carry (rare) for events that
        carry none of their own; None when no metadata carries one."""
        given = {
            key: int(stats[CORRELATION_STAT])
            for key, (_, stats) in self.metadata.items()
            if isinstance(stats.get(CORRELATION_STAT), int)
        }
        if not given:
            return None
        keys = np.array(sorted(given), dtype=np.int64)
        values = np.array([given[key] for key in keys.tolist()], dtype=np.int64)
        index = np.minimum(np.searchsorted(keys, metadata_ids), len(keys) - 1)
        inherit = (correlation < 0) & (keys[index] == metadata_ids)
        return np.where(inherit, values[index], correlation)


def read_device_events(plane, origin_ps: int) -> DeviceEvents:
    """The kernels and copies on a GPU plane's ``Stream #`` lines, read once, as arrays
    (times in picoseconds from ``origin_ps``)."""
    return _PlaneReader(plane, origin_ps).read(plane.lines)


def read_launches(events, indices: np.ndarray, starts: np.ndarray, stat_id: int):
    """(correlation ids, starts) of the host CUDA calls at ``indices`` of a line's
    ``events`` (``starts``: every event's start) that carry a ``correlation_id`` (stat
    metadata id ``stat_id``), as arrays."""
    chosen = [events[index] for index in indices.tolist()]
    owner, fields = stat_table(chosen, len(chosen))
    correlation = correlation_ids(chosen, owner, fields, stat_id, len(chosen))
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
