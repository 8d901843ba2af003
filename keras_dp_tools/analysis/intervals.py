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
    """``length(merge(zip(starts, ends)))`` for integer arrays, vectorised: sorted by
    start, each interval adds what it reaches past all earlier ones' ends."""
    if len(starts) == 0:
        return 0
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reached = np.maximum.accumulate(ends)
    floor = np.maximum(starts[1:], reached[:-1])
    first = max(int(ends[0] - starts[0]), 0)
    return first + int(np.clip(ends[1:] - floor, 0, None).sum())
