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
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from keras_dp_tools.analysis import gpu_trace, intervals
from keras_dp_tools.analysis.classify import (
    PEER_KINDS,
    PER_REPLICA_COPY_TYPES,
    Kind,
    classify_host_event,
    copy_number,
    receiving_device,
    scoped_replica,
)
from keras_dp_tools.analysis.replicas import packed_replica, peer_replicas
from keras_dp_tools.analysis.xspace import (
    StepMarker,
    gpu_planes,
    host_planes,
    load_xspace,
    plane_events,
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


def _cpu_spans(space, devices: Sequence[str] | None = None) -> list[_Span]:
    spans = []
    for plane in host_planes(space):
        for event in plane_events(plane):
            classified = classify_host_event(event)
            if classified is not None:
                kind, replica = classified
                if kind is Kind.COPY and replica is not None and scoped_replica(event.name) is None:
                    # An unscoped transfer (e.g. feeding replica 3's collective from
                    # /cpu:0) serves the replica that receives it.
                    replica = _device_replica(receiving_device(event), devices, replica)
                key = _peer_key(event.stats) if kind in PEER_KINDS else None
                copied = kind in PEER_KINDS or _op_type(event.name) in PER_REPLICA_COPY_TYPES
                name = event.name if copied else ""
                spans.append(_Span(kind, replica, event.start_ps, event.end_ps, key, name))
    return spans


def _attribute_cpu_replicas(
    spans: list[_Span], replica_count: int
) -> tuple[list[_Span], str | None]:
    """Gives the per-replica copies of collectives and packing ops their replica (see
    ``keras_dp_tools.analysis.replicas``); returns the spans and why some could not be
    attributed (None if all could)."""
    peers: dict[object, list[int]] = defaultdict(list)
    for position, span in enumerate(spans):
        if span.peer_key is not None:
            peers[span.peer_key].append(position)
    replica_of: dict[int, int] = {}
    reasons = []
    for positions in peers.values():
        names = [spans[p].name.rsplit(":", 1)[0] for p in positions]
        if all(scoped_replica(name) is not None for name in names):
            continue  # replica scopes say it
        replicas, reason = peer_replicas(names, replica_count)
        if replicas is None:
            reasons.append(reason)
            continue
        replica_of.update(zip(positions, replicas, strict=True))
    copies: dict[str, set[int]] = defaultdict(set)
    for span in spans:
        if span.peer_key is None and span.name:
            base, number = copy_number(span.name)
            copies[base].add(number)
    resolved = []
    for position, span in enumerate(spans):
        replica = replica_of.get(position)
        if (
            replica is None
            and span.peer_key is None
            and span.name
            and scoped_replica(span.name) is None
        ):
            base, number = copy_number(span.name)
            replica = packed_replica(number, copies[base], replica_count)
            if replica is None and len(copies[base]) == 1:
                replica = 0  # one unscoped copy: replica 0's op
            elif replica is None:
                reasons.append(f"{len(copies[base])} copies of {base} for {replica_count} replicas")
        if replica is None and span.replica is not None and span.replica >= replica_count:
            replica = span.replica % replica_count  # a guess, and said so in reasons
        resolved.append(span if replica is None else replace(span, replica=replica))
    reason = "; ".join(sorted(set(reasons))) or None
    return resolved, reason


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


def _gpu_spans(space, ordinals: Sequence[int], host_events, markers) -> list[_Span]:
    launches = gpu_trace.launch_markers(host_events, markers)
    spans = [
        _Span(
            s.kind,
            s.replica,
            s.start_ps,
            s.end_ps,
            launched_in=s.launched_in,
            collective=s.collective,
        )
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
        replace(s, start_ps=max(s.start_ps, start), end_ps=min(s.end_ps, stop))
        for s, stop in clip_ends
    ]
    return inside, end


def _iterations(inside: list[_Span]) -> int:
    """Steps of one call as its collectives count them (distinct ``iter_id``)."""
    iterations = {span.peer_key[-1] for span in inside if isinstance(span.peer_key, tuple)}
    return len(iterations - {None}) or 1


def _replica_rows(
    marker: StepMarker,
    spans: list[_Span],
    replica_ids,
    devices,
    facts: RunFacts,
    peak_gbps: float | None = None,
):
    start = marker.start_ps
    inside, end = _step_spans(marker, spans)
    steps = facts.steps_covered.get(marker.step) or _iterations(inside)
    waits = _sync_waits([s for s in inside if s.kind is Kind.COLLECTIVE])
    for replica, parts in _sync_waits([s for s in inside if s.kind is Kind.GATHER]).items():
        waits[replica] += parts
    # Time any replica runs anything, and the host's time around the train function.
    active = intervals.merge((s.start_ps, s.end_ps) for s in inside)
    first, last = (active[0][0], active[-1][1]) if active else (end, end)
    around_function = intervals.merge([(start, first), (last, end)])
    idle = intervals.subtract([(first, last)], active)
    has_gathers = any(s.kind is Kind.GATHER for s in inside)
    reduce_bytes = facts.allreduce_bytes
    if has_gathers and reduce_bytes and facts.sparse_bytes:
        reduce_bytes -= facts.sparse_bytes
    ranks = facts.group_size
    to_ms = 1e-9 / steps  # picoseconds of the call to milliseconds per step
    rows = []
    for replica in replica_ids:

        def union(*kinds, replica=replica):
            return intervals.merge(
                (s.start_ps, s.end_ps)
                for s in inside
                if s.kind in kinds and (s.replica == replica or s.replica is None)
            )

        compute = union(Kind.COMPUTE)
        reduce = union(Kind.COLLECTIVE, Kind.COPY)
        gather = union(Kind.GATHER)
        comm = intervals.merge(reduce + gather)
        wait = intervals.merge(waits.get(replica, []))  # inside comm
        busy = intervals.merge(compute + comm)
        input_exposed = intervals.subtract(union(Kind.INPUT), busy)
        other = intervals.subtract(intervals.subtract([(start, end)], busy), input_exposed)
        exposed_comm = intervals.length(comm) - intervals.overlap_length(comm, compute)
        exposed_wait = intervals.length(wait) - intervals.overlap_length(wait, compute)
        transfer = intervals.length(comm) - intervals.length(wait)
        # Each collective's bandwidth uses its own time: all-reduces and all-gathers
        # can run at once, and then both moved their bytes in that time. Only the
        # all-reduce collectives carry the gradients' bytes: copies (peer copies, the
        # sends around a collective) would turn their tiny times into huge bandwidths.
        reducing = intervals.merge(
            (s.start_ps, s.end_ps)
            for s in inside
            if s.kind is Kind.COLLECTIVE
            and s.collective in (None, "all_reduce")
            and (s.replica == replica or s.replica is None)
        )
        reduce_transfer = intervals.length(intervals.subtract(reducing, wait))
        dispatch = intervals.overlap_length(other, around_function)
        idle_here = intervals.overlap_length(other, idle)
        row = {
            "step": marker.step,
            "replica": replica,
            "device": devices[replica] if devices and replica < len(devices) else None,
            "steps": steps,
            "step_ms": (end - start) * to_ms,
            "compute_ms": intervals.length(compute) * to_ms,
            "allreduce_ms": intervals.length(comm) * to_ms,
            "sync_wait_ms": intervals.length(wait) * to_ms,
            "transfer_ms": transfer * to_ms,
            "gather_ms": intervals.length(gather) * to_ms,
            "gather_transfer_ms": intervals.length(intervals.subtract(gather, wait)) * to_ms,
            "exposed_allreduce_ms": exposed_comm * to_ms,
            "exposed_sync_wait_ms": exposed_wait * to_ms,
            "exposed_transfer_ms": (exposed_comm - exposed_wait) * to_ms,
            "input_ms": intervals.length(input_exposed) * to_ms,
            "other_ms": intervals.length(other) * to_ms,
            "dispatch_ms": dispatch * to_ms,
            "idle_ms": idle_here * to_ms,
            "scheduling_ms": (intervals.length(other) - dispatch - idle_here) * to_ms,
        }
        step_ms = row["step_ms"]
        row["comm_share"] = row["exposed_transfer_ms"] / step_ms if step_ms else None
        row["wait_share"] = row["exposed_sync_wait_ms"] / step_ms if step_ms else None
        row["reduce_transfer_ms"] = reduce_transfer * to_ms  # not a column: for bandwidth
        row["reduce_ms"] = intervals.length(reduce) * to_ms
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
    host_events = [event for plane in host_planes(space) for event in plane_events(plane)]
    markers = step_markers(host_events)
    attribution = None
    # The strategy's devices choose the path; a CPU strategy ignores GPU planes.
    ordinals = gpu_trace.choose_gpu_planes(space, devices)
    if ordinals is not None:
        spans = _gpu_spans(space, ordinals, host_events, markers)
        replica_count = replicas or len(ordinals)
        link_peak_gbps = link_peak_gbps or gpu_trace.DEFAULT_GPU_PEAK_GBPS
    else:
        spans = _cpu_spans(space, devices)
        replica_count = replicas or _cpu_replica_count(spans)
        spans, attribution = _attribute_cpu_replicas(spans, replica_count)
    facts = RunFacts(
        allreduce_bytes=allreduce_bytes,
        sparse_bytes=sparse_bytes,
        gather_bytes=gather_bytes,
        steps_covered=dict(steps_covered or {}),
        group_size=group_size or replica_count,
    )
    rows = [
        row
        for marker in markers
        for row in _replica_rows(
            marker, spans, range(replica_count), devices, facts, link_peak_gbps
        )
    ]
    replica_frame = pd.DataFrame(rows, columns=[*REPLICA_COLUMNS, *_BANDWIDTH_TIMES])
    replica_frame = replica_frame.astype(dict.fromkeys(_BANDWIDTHS, float))
    steps = _step_rows(replica_frame, facts, link_peak_gbps)
    return Breakdown(replica_frame[REPLICA_COLUMNS], steps, attribution=attribution)


def _cpu_replica_count(spans: list[_Span]) -> int:
    """Peers of the largest collective (one op per replica), else the replica scopes."""
    peers: dict[object, int] = defaultdict(int)
    for span in spans:
        if span.peer_key is not None:
            peers[span.peer_key] += 1
    scoped = 1 + max((s.replica for s in spans if s.replica is not None and not s.name), default=0)
    return max(peers.values(), default=0) or scoped


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
