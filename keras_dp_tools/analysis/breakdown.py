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
from the transfer time of all-reduce collectives only (never from copies); a bus
bandwidth above the link's physical peak is not shown, and ``bandwidth_note`` says why.

On GPU traces (``gpu_trace``) a step lasts from its marker's start to the end of the
last device event it launched, so late optimizer kernels count in their own step.

Pure functions over a parsed trace: no TensorFlow session, no training needed.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from keras_dp_tools.analysis import gpu_trace, intervals
from keras_dp_tools.analysis.classify import Kind, classify_host_event
from keras_dp_tools.analysis.xspace import (
    StepMarker,
    gpu_planes,
    host_planes,
    load_xspace,
    plane_events,
    step_markers,
)

REPLICA_COLUMNS = [
    "step",
    "replica",
    "device",
    "step_ms",
    "compute_ms",
    "allreduce_ms",
    "sync_wait_ms",
    "transfer_ms",
    "exposed_allreduce_ms",
    "exposed_sync_wait_ms",
    "exposed_transfer_ms",
    "input_ms",
    "other_ms",
    "comm_share",
    "wait_share",
    "allreduce_bytes",
    "algbw_gbps",
    "busbw_gbps",
    "bandwidth_note",
]
# Per-replica times the step row averages over replicas.
_MEAN_COLUMNS = REPLICA_COLUMNS[4:15]
STEP_COLUMNS = [
    "step",
    "replicas",
    "step_ms",
    *_MEAN_COLUMNS,
    "max_sync_wait_ms",
    "straggler_replica",
    "allreduce_bytes",
    "algbw_gbps",
    "busbw_gbps",
    "bandwidth_note",
]
XPROF_COLUMNS = [
    "xprof_step_ms",
    "xprof_collectives_ms",
    "xprof_device_compute_ms",
    "xprof_device_to_device_ms",
]


@dataclass(frozen=True, slots=True)
class _Span:
    kind: Kind
    replica: int | None  # None: shared by all replicas (e.g. one input pipeline)
    start_ps: int
    end_ps: int
    peer_key: object = None  # collectives with one key are the same operation on peers
    # GPU: (step, marker start) of the marker that launched it; None: by time.
    launched_in: tuple[int, int] | None = None
    collective: str | None = None  # NCCL's operation (all_reduce, all_gather, ...)


@dataclass
class Breakdown:
    """The breakdown of one trace.

    Attributes:
        replicas: one row per step and replica (``REPLICA_COLUMNS``).
        steps: one row per step, times averaged over replicas (``STEP_COLUMNS``),
            plus XProf's own step numbers (``XPROF_COLUMNS``) where it has device data.
        source: the trace file, if read from one.
    """

    replicas: pd.DataFrame
    steps: pd.DataFrame
    source: str | None = None


def _cpu_spans(space) -> list[_Span]:
    spans = []
    for plane in host_planes(space):
        for event in plane_events(plane):
            classified = classify_host_event(event)
            if classified is not None:
                kind, replica = classified
                key = event.stats.get("instance_key") if kind is Kind.COLLECTIVE else None
                spans.append(_Span(kind, replica, event.start_ps, event.end_ps, key))
    return spans


def _gpu_spans(space, ordinals: Sequence[int], host_events, markers) -> list[_Span]:
    launches = gpu_trace.launch_markers(host_events, markers)
    spans = [
        _Span(s.kind, s.replica, s.start_ps, s.end_ps, None, s.launched_in, s.collective)
        for s in gpu_trace.device_spans(space, ordinals, launches)
    ]
    for plane in host_planes(space):  # input waits happen on the host
        for event in plane_events(plane):
            classified = classify_host_event(event)
            if classified is not None and classified[0] is Kind.INPUT:
                spans.append(_Span(Kind.INPUT, classified[1], event.start_ps, event.end_ps))
    return spans


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


def _bandwidths(allreduce_bytes, transfer_ms, replica_count):
    if not allreduce_bytes or not transfer_ms or transfer_ms <= 0:
        return None, None
    algbw = allreduce_bytes / (transfer_ms / 1e3) / 1e9
    return algbw, algbw * 2 * (replica_count - 1) / replica_count


def _checked_bandwidths(allreduce_bytes, transfer_ms, replica_count, peak_gbps, missing):
    """(algbw, busbw, note): None values with a note saying why when not shown."""
    algbw, busbw = _bandwidths(allreduce_bytes, transfer_ms, replica_count)
    too_fast = gpu_trace.check_bandwidth(busbw, peak_gbps)
    if too_fast:
        return None, None, too_fast
    return algbw, busbw, missing if busbw is None else None


def _step_spans(marker: StepMarker, spans: list[_Span]) -> tuple[list[_Span], int]:
    """The spans of a step, clipped to it, and the step's end. A device event launched
    inside the marker belongs to it whenever it ran; the step then lasts until its last
    launched event ends. Events without that link count by time within the marker."""
    start, key = marker.start_ps, (marker.step, marker.start_ps)
    launched = [s for s in spans if s.launched_in == key]
    end = max([marker.end_ps, *(s.end_ps for s in launched)])
    by_time = [
        s
        for s in spans
        if s.launched_in is None and s.start_ps < marker.end_ps and s.end_ps > start
    ]
    clip_ends = [(s, end) for s in launched] + [(s, marker.end_ps) for s in by_time]
    inside = [
        _Span(
            s.kind,
            s.replica,
            max(s.start_ps, start),
            min(s.end_ps, stop),
            s.peer_key,
            s.launched_in,
            s.collective,
        )
        for s, stop in clip_ends
    ]
    return inside, end


def _replica_rows(
    marker: StepMarker,
    spans: list[_Span],
    replica_ids,
    devices,
    total_bytes,
    group_size,
    peak_gbps=None,
):
    start = marker.start_ps
    inside, end = _step_spans(marker, spans)
    waits = _sync_waits([s for s in inside if s.kind is Kind.COLLECTIVE])
    step_ps = end - start
    rows = []
    for replica in replica_ids:

        def union(*kinds, replica=replica):
            return intervals.merge(
                (s.start_ps, s.end_ps)
                for s in inside
                if s.kind in kinds and (s.replica == replica or s.replica is None)
            )

        compute = union(Kind.COMPUTE)
        comm = union(Kind.COLLECTIVE, Kind.COPY)
        wait = intervals.merge(waits.get(replica, []))
        busy = intervals.merge(compute + comm)
        input_wait = union(Kind.INPUT)
        exposed_comm = intervals.length(comm) - intervals.overlap_length(comm, compute)
        exposed_wait = intervals.length(wait) - intervals.overlap_length(wait, compute)
        input_exposed = intervals.length(input_wait) - intervals.overlap_length(input_wait, busy)
        to_ms = 1e-9
        row = {
            "step": marker.step,
            "replica": replica,
            "device": devices[replica] if devices and replica < len(devices) else None,
            "step_ms": step_ps * to_ms,
            "compute_ms": intervals.length(compute) * to_ms,
            "allreduce_ms": intervals.length(comm) * to_ms,
            "sync_wait_ms": intervals.length(wait) * to_ms,
            "transfer_ms": (intervals.length(comm) - intervals.length(wait)) * to_ms,
            "exposed_allreduce_ms": exposed_comm * to_ms,
            "exposed_sync_wait_ms": exposed_wait * to_ms,
            "exposed_transfer_ms": (exposed_comm - exposed_wait) * to_ms,
            "input_ms": input_exposed * to_ms,
            "other_ms": (step_ps - intervals.length(busy) - input_exposed) * to_ms,
        }
        row["comm_share"] = row["exposed_transfer_ms"] / row["step_ms"] if step_ps else None
        row["wait_share"] = row["exposed_sync_wait_ms"] / row["step_ms"] if step_ps else None
        # Bytes are the gradients' all-reduce: only all-reduce collectives carry them.
        reducing = intervals.merge(
            (s.start_ps, s.end_ps)
            for s in inside
            if s.kind is Kind.COLLECTIVE
            and s.collective in (None, "all_reduce")
            and (s.replica == replica or s.replica is None)
        )
        reduce_ps = intervals.length(reducing) - intervals.overlap_length(reducing, wait)
        replica_bytes = total_bytes if reduce_ps > 0 else None
        row["allreduce_bytes"] = replica_bytes
        row["algbw_gbps"], row["busbw_gbps"], row["bandwidth_note"] = _checked_bandwidths(
            replica_bytes,
            reduce_ps * to_ms,
            group_size,
            peak_gbps,
            _missing_bandwidth(total_bytes, group_size, reduce_ps),
        )
        rows.append(row)
    return rows


def _missing_bandwidth(total_bytes, group_size, reduce_ps) -> str | None:
    if group_size <= 1:
        return "one replica: nothing to all-reduce"
    if not total_bytes:
        return "all-reduce bytes unknown (pass allreduce_bytes)"
    if reduce_ps <= 0:
        return "no all-reduce collective ran in this step"
    return None


def _step_rows(replica_frame: pd.DataFrame, replica_count: int) -> pd.DataFrame:
    if replica_frame.empty:
        return pd.DataFrame(columns=STEP_COLUMNS)
    grouped = replica_frame.groupby("step", sort=True)
    steps = grouped[_MEAN_COLUMNS].mean()
    steps.insert(0, "step_ms", grouped["step_ms"].first())
    steps.insert(0, "replicas", grouped["replica"].nunique())
    steps["max_sync_wait_ms"] = grouped["sync_wait_ms"].max()
    # The replica the others waited for arrived last, so it waited least itself.
    straggler = replica_frame.loc[grouped["sync_wait_ms"].idxmin(), ["step", "replica"]]
    steps["straggler_replica"] = straggler.set_index("step")["replica"].where(
        steps["max_sync_wait_ms"] > 0
    )
    steps["allreduce_bytes"] = grouped["allreduce_bytes"].max()
    # Each replica's bandwidth comes from its own all-reduce kernels and was checked
    # against the link's peak: the step shows their mean, or why there is none.
    steps["algbw_gbps"] = grouped["algbw_gbps"].mean()
    steps["busbw_gbps"] = grouped["busbw_gbps"].mean()
    steps["bandwidth_note"] = grouped["bandwidth_note"].first().where(steps["busbw_gbps"].isna())
    steps["straggler_replica"] = steps["straggler_replica"].astype("Int64")
    return steps.reset_index()[STEP_COLUMNS]


def analyze_xspace(
    space,
    *,
    allreduce_bytes: int | None = None,
    replicas: int | None = None,
    devices: Sequence[str] | None = None,
    group_size: int | None = None,
    link_peak_gbps: float | None = None,
) -> Breakdown:
    """Breaks every marked step of a parsed XSpace down per replica.

    Args:
        space: an ``XSpace`` proto (see ``load_xspace``).
        allreduce_bytes: bytes each replica all-reduces per step (the gradients), for the
            bandwidth columns; None leaves them empty.
        replicas: replicas in this trace (this worker's, under a multi-worker
            strategy); by default, those seen in the trace (GPU planes, or
            ``replica_k`` scopes and collective copies on CPU).
        devices: device names of the replicas in order, to label the rows; on GPU
            traces, their ordinals choose the planes (``/gpu:2`` is ``/device:GPU:2``).
        group_size: ranks taking part in each all-reduce (``num_replicas_in_sync``),
            for the bus bandwidth; by default ``replicas``. Under a multi-worker
            strategy the peers in other processes are not in this trace, so the sync
            wait only covers this worker's replicas.
        link_peak_gbps: the interconnect's peak bandwidth per GPU and direction
            (``gpu_trace.LINK_PEAK_GBPS`` lists common ones); a bus bandwidth above it
            is not shown. GPU traces default to the fastest NVLink.

    Returns:
        A ``Breakdown``; empty frames if the trace has no step markers.

    Raises:
        gpu_trace.UnusableTraceError: the replicas run on GPUs but a replica's GPU has
            no device events in the trace (the message says why).
    """
    host_events = [event for plane in host_planes(space) for event in plane_events(plane)]
    markers = step_markers(host_events)
    # The strategy's devices choose the path; a CPU strategy ignores GPU planes.
    ordinals = gpu_trace.choose_gpu_planes(space, devices)
    if ordinals is not None:
        spans = _gpu_spans(space, ordinals, host_events, markers)
        seen = len(ordinals)
        link_peak_gbps = link_peak_gbps or gpu_trace.DEFAULT_GPU_PEAK_GBPS
    else:
        spans = _cpu_spans(space)
        seen = _cpu_replica_count(spans)
    replica_count = replicas or seen
    spans = [_wrap_replica(span, replica_count) for span in spans]
    group_size = group_size or replica_count
    total_bytes = allreduce_bytes if group_size > 1 else None
    rows = [
        row
        for marker in markers
        for row in _replica_rows(
            marker, spans, range(replica_count), devices, total_bytes, group_size, link_peak_gbps
        )
    ]
    replica_frame = pd.DataFrame(rows, columns=REPLICA_COLUMNS)
    replica_frame = replica_frame.astype({"algbw_gbps": float, "busbw_gbps": float})
    return Breakdown(replica_frame, _step_rows(replica_frame, group_size))


def _cpu_replica_count(spans: list[_Span]) -> int:
    """Peers of the largest collective (one op per replica), else the replica scopes."""
    peers: dict[object, int] = defaultdict(int)
    for span in spans:
        if span.peer_key is not None:
            peers[span.peer_key] += 1
    scoped = 1 + max((s.replica for s in spans if s.replica is not None), default=0)
    return max(peers.values(), default=0) or scoped


def _wrap_replica(span: _Span, replica_count: int) -> _Span:
    if span.replica is None or span.replica < replica_count:
        return span
    return replace(span, replica=span.replica % replica_count)


def analyze_trace(
    path: str | os.PathLike,
    *,
    allreduce_bytes: int | None = None,
    replicas: int | None = None,
    devices: Sequence[str] | None = None,
    group_size: int | None = None,
    link_peak_gbps: float | None = None,
    xprof: bool | None = None,
) -> Breakdown:
    """``analyze_xspace`` on one ``.xplane.pb`` file.

    Args:
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
