"""Interval arithmetic on time spans: the unions, overlaps and differences that turn
trace events into exclusive parts of a step.

An interval is a ``(start, end)`` pair of integers (picoseconds in traces) with
``start <= end``. "Merged" lists are sorted and non-overlapping; ``merge`` makes one.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

Interval = tuple[int, int]


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """The union of ``intervals`` as a sorted list of disjoint intervals (touching
    intervals are joined; empty ones dropped)."""
    merged: list[list[int]] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end) for start, end in merged]


def length(merged: Iterable[Interval]) -> int:
    """Total time covered by a merged list."""
    return sum(end - start for start, end in merged)


def intersect(first: list[Interval], second: list[Interval]) -> list[Interval]:
    """Time covered by both merged lists, as a merged list (one linear sweep)."""
    overlap = []
    i = j = 0
    while i < len(first) and j < len(second):
        start = max(first[i][0], second[j][0])
        end = min(first[i][1], second[j][1])
        if start < end:
            overlap.append((start, end))
        if first[i][1] < second[j][1]:
            i += 1
        else:
            j += 1
    return overlap


def overlap_length(first: list[Interval], second: list[Interval]) -> int:
    """``length(intersect(first, second))`` for two merged lists."""
    return length(intersect(first, second))


def subtract(merged: list[Interval], removed: list[Interval]) -> list[Interval]:
    """Time in the merged list ``merged`` not covered by the merged list ``removed``."""
    left = []
    j = 0
    for start, end in merged:
        while j < len(removed) and removed[j][1] <= start:
            j += 1
        k = j
        while k < len(removed) and removed[k][0] < end:
            if removed[k][0] > start:
                left.append((start, removed[k][0]))
            start = max(start, removed[k][1])
            k += 1
        if start < end:
            left.append((start, end))
    return left


def union_length(starts: np.ndarray, ends: np.ndarray) -> int:
    """``length(merge(zip(starts, ends)))`` for integer arrays, vectorised."""
    order = np.argsort(starts, kind="stable")
    groups = np.zeros(len(starts), dtype=np.int64)
    return int(union_lengths(groups, starts[order], ends[order], 1)[0])


# Shifted times stay below this, far from int64's end.
_SHIFT_LIMIT = 2**62


def union_lengths(groups: np.ndarray, starts: np.ndarray, ends: np.ndarray, count: int):
    """Per group ``0..count-1``, the length of the union of its intervals, for integer
    arrays sorted by group and, within a group, by start (one pass for all groups).

    Each interval adds what it reaches past the ends of the earlier intervals of its
    group. To take that running maximum over all groups at once, each group's times
    are shifted into a range of their own, above the previous group's.
    """
    lengths = np.zeros(count, dtype=np.int64)
    kept = ends > starts  # empty intervals add nothing
    groups, starts, ends = groups[kept], starts[kept], ends[kept]
    if not len(groups):
        return lengths
    heads = np.flatnonzero(np.concatenate([[True], groups[1:] != groups[:-1]]))
    base = starts[heads]
    extent = np.maximum.reduceat(ends, heads) - base + 1
    if extent.sum(dtype=np.float64) >= _SHIFT_LIMIT:  # split the groups, never overflow
        middle = int(heads[len(heads) // 2]) if len(heads) > 1 else None
        if middle is None:
            return _union_lengths_unshifted(groups, starts, ends, lengths)
        for part in (slice(0, middle), slice(middle, None)):
            lengths += union_lengths(groups[part], starts[part], ends[part], count)
        return lengths
    offset = np.cumsum(extent) - extent - base
    shift = np.repeat(offset, np.diff(np.append(heads, len(groups))))
    starts, ends = starts + shift, ends + shift
    reached = np.maximum.accumulate(ends)
    floor = starts.copy()
    np.maximum(starts[1:], reached[:-1], out=floor[1:])
    gained = np.maximum(ends - floor, 0)
    lengths[groups[heads]] = np.add.reduceat(gained, heads)
    return lengths


def _union_lengths_unshifted(groups, starts, ends, lengths):
    """One group, no shift needed."""
    reached = np.maximum.accumulate(ends)
    floor = starts.copy()
    np.maximum(starts[1:], reached[:-1], out=floor[1:])
    lengths[groups[0]] += int(np.maximum(ends - floor, 0).sum())
    return lengths
