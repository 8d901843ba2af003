"""The union lengths behind the breakdown, against a plain merge of the intervals (the
oracle, kept here as test code: the package needs only the vectorised lengths)."""

import numpy as np

from keras_dp_tools.analysis.breakdown import intervals


def merge(spans) -> list[tuple[int, int]]:
    """The union of ``spans`` as a sorted list of disjoint intervals (touching ones
    joined, empty ones dropped), one interval at a time."""
    merged: list[list[int]] = []
    for start, end in sorted(spans):
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end) for start, end in merged]


def length(merged) -> int:
    return sum(end - start for start, end in merged)


def test_merge_joins_overlapping_and_touching_and_drops_empty():
    assert merge([(5, 7), (0, 2), (1, 3), (3, 4), (9, 9), (8, 6)]) == [(0, 4), (5, 7)]


def test_union_length_matches_merge_on_random_intervals():
    rng = np.random.default_rng(0)
    for size in (0, 1, 2, 5, 50, 500):
        starts = rng.integers(0, 1000, size)
        ends = starts + rng.integers(-20, 100, size)  # some empty or inverted
        expected = length(merge(zip(starts.tolist(), ends.tolist(), strict=True)))
        order = np.argsort(starts, kind="stable")
        one_group = np.zeros(size, dtype=np.int64)
        assert intervals.union_lengths(one_group, starts[order], ends[order], 1)[0] == expected


def test_union_lengths_per_group_match_merge_on_random_intervals():
    rng = np.random.default_rng(1)
    count = 40
    groups = np.sort(rng.integers(0, count, 3000))  # some groups left empty
    starts = rng.integers(-(10**15), 10**15, len(groups))  # picoseconds far apart
    ends = starts + rng.integers(-(10**12), 10**13, len(groups))
    order = np.lexsort((starts, groups))
    lengths = intervals.union_lengths(groups[order], starts[order], ends[order], count)
    for group in range(count):
        mine = groups == group
        expected = length(merge(zip(starts[mine].tolist(), ends[mine].tolist(), strict=True)))
        assert lengths[group] == expected


def test_union_lengths_of_groups_too_long_to_shift_together():
    # Four groups of 2**61 each: shifted side by side they would pass int64's end.
    span = 2**61
    groups = np.array([0, 0, 1, 2, 2, 3])
    starts = np.array([0, span // 2, 0, 0, 10, -span])
    ends = np.array([span // 2 + 5, span, span, 5, span, 0])
    lengths = intervals.union_lengths(groups, starts, ends, 4)
    assert lengths.tolist() == [span, span, span - 5, span]


def test_union_lengths_when_the_groups_extents_alone_pass_int64s_end():
    # Their sum of extents wraps around in int64 (6 x ~2**61.6): only a float sum sees it.
    span = 2**61
    groups = np.arange(6)
    starts = np.array([0, 0, 0, 0, 0, 1])
    ends = np.array([span, span, span, span, span, 2**62])
    lengths = intervals.union_lengths(groups, starts, ends, 6)
    assert lengths.tolist() == [span] * 5 + [2**62 - 1]
