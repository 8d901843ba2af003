"""Union lengths of time spans, per group, vectorised: the step engine's one piece of
interval arithmetic (what a replica's compute, communication, ... cover in a step).

An interval is a ``(start, end)`` pair of integers (picoseconds in traces); an empty or
inverted one (``end <= start``) covers nothing.
"""

from __future__ import annotations

import numpy as np

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
