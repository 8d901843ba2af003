"""The step engine: which spans each step holds, and the union lengths of each
(step, replica) over compute, communication, sync waits and input, vectorised over
steps (each span is assigned to its steps once; one sort per batch of markers).

On GPU traces a device event launched inside a marker belongs to that marker's step
whenever it ran; other spans belong to every marker they overlap, clipped to each.
"""

from __future__ import annotations

import numpy as np

from keras_dp_tools.analysis.breakdown.classify import KIND_CODES, Kind
from keras_dp_tools.analysis.breakdown.intervals import union_lengths
from keras_dp_tools.analysis.breakdown.spans import NO_REPLICA, Spans

_CODE = KIND_CODES
# Bits of the things a step's union lengths are taken over.
_COMPUTE, _REDUCE, _GATHER, _INPUT, _REDUCING, _WAIT = (1 << bit for bit in range(6))


# Spans per block of the step index's maxima of ends.
REACH_BLOCK = 256


class StepIndex:
    """Finds the spans of a run of markers without scanning them all: spans launched by
    a marker are sorted by marker; the others are found by time in the spans sorted
    by start (``sort_by_start``): up to a binary search on the starts, in the blocks
    (of ``REACH_BLOCK`` spans) whose latest end comes after the run starts. One
    maximum per block (a few kB, not a span-sized array), and not a running maximum: a
    span lasting the whole trace brings its own block into every run, not every block
    after it. Launched spans are left out of the maxima (they are found by marker)."""

    def __init__(self, spans: Spans):
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
        blocks = np.flatnonzero(self.reach[: -(-high // REACH_BLOCK)] > start)
        candidates = (blocks[:, None] * REACH_BLOCK + np.arange(REACH_BLOCK)).ravel()
        candidates = candidates[candidates < high]
        if self.linked is not None:
            candidates = candidates[~self.linked[candidates]]
        return np.concatenate([launched, candidates[self.ends[candidates] > start]])


def _block_maxima(ends: np.ndarray, skipped: np.ndarray | None) -> np.ndarray:
    """The latest end of each block of ``REACH_BLOCK`` spans, leaving out the
    ``skipped`` ones (a block of only those: the smallest int64), a few blocks at a time
    so that no span-sized temporary is made."""
    if skipped is None:
        heads = np.arange(0, len(ends), REACH_BLOCK)
        return np.maximum.reduceat(ends, heads) if len(ends) else ends.copy()
    lowest = np.iinfo(np.int64).min
    piece = REACH_BLOCK * 256
    maxima = []
    for first in range(0, len(ends), piece):
        kept = np.where(skipped[first : first + piece], lowest, ends[first : first + piece])
        maxima.append(np.maximum.reduceat(kept, np.arange(0, len(kept), REACH_BLOCK)))
    return np.concatenate(maxima) if maxima else np.empty(0, np.int64)


def _step_pairs(starts, marker_ends, spans: Spans, candidates, first: int):
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


def _sync_waits(marker, position, start, end, spans: Spans, key_ids):
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


def batch_lengths(
    step_start, marker_ends, spans: Spans, candidates, first, replica_count, keys, multi
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
    busy_any = union_lengths(marker[order], start[order], end[order], count)
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
    shared = np.flatnonzero(owner == NO_REPLICA)
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
        per_row[name] = union_lengths(group[chosen], item_start[chosen], item_end[chosen], rows)
    return {**per_marker, **per_row}


# Spans per batch of markers: bounds the engine's memory (its arrays are a few times
