"""Lookups on a run's step keys (run, worker, step) without hashing every row: the
position of each row's key in another frame, the sort order, the blocks of sorted
keys, and a column's values taken at positions. Millions of steps make a hash join or
a groupby on the run id slow (benchmarks/NOTES.md); these work on integer codes.

Pure functions over DataFrames and arrays; no TensorFlow.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def warmup_mask(steps: pd.DataFrame) -> pd.Series:
    return steps["warmup"].astype("boolean").fillna(False).astype(bool)


def taken(column: pd.Series, positions: np.ndarray, index: pd.Index) -> pd.Series:
    """``column``'s values at ``positions`` (-1: empty) as a series on ``index``."""
    # A float column: NaN, then the values at their rows (a take with a fill is slow).
    if isinstance(column.dtype, np.dtype) and column.dtype.kind == "f":
        values = np.full(len(positions), np.nan, dtype=column.dtype)
        found = positions >= 0
        values[found] = column.to_numpy()[positions[found]]
        return pd.Series(values, index=index, name=column.name, copy=False)
    return pd.Series(column.array.take(positions, allow_fill=True), index=index, name=column.name)


def sorted_codes(values: pd.Series) -> tuple[np.ndarray, pd.Index]:
    """Integer codes of the values, in the order the values sort (run ids)."""
    codes, uniques = pd.factorize(values, sort=True)
    return codes, pd.Index(uniques)


def key_positions(left: pd.DataFrame, right: pd.DataFrame, keys: list[str]) -> np.ndarray | None:
    """For each row of ``left``, the position of the row of ``right`` with the same
    ``keys`` (-1: none), as a left merge finds it without hashing every key; None where
    a key is empty somewhere, ``right``'s are not unique or do not fit one int64."""
    packed_left = np.zeros(len(left), dtype=np.int64)
    packed_right = np.zeros(len(right), dtype=np.int64)
    span = 1
    for name in keys:
        if left[name].hasnans or right[name].hasnans:
            return None
        if name == "run":
            values, uniques = sorted_codes(left[name])
            # Through the right side's few run ids: hashing each row's string cost more.
            right_codes, right_uniques = pd.factorize(right[name])
            other_values = uniques.get_indexer(right_uniques)[right_codes]
            other_values[other_values < 0] = len(uniques)  # runs left does not have
            size = len(uniques) + 1
        else:
            values = left[name].to_numpy(dtype="int64")
            other_values = right[name].to_numpy(dtype="int64")
            low = min(values.min(initial=0), other_values.min(initial=0))
            values, other_values = values - low, other_values - low
            size = int(max(values.max(initial=0), other_values.max(initial=0))) + 1
        span *= size
        if span >= 2**62:
            return None
        packed_left = packed_left * size + values
        packed_right = packed_right * size + other_values
    if (packed_right[1:] >= packed_right[:-1]).all():  # in order already
        order = np.arange(len(packed_right))
    else:
        order = np.argsort(packed_right, kind="stable")
    ranked = packed_right[order]
    if (ranked[1:] == ranked[:-1]).any():
        return None
    if not len(ranked):
        return np.full(len(left), -1)
    found = np.minimum(np.searchsorted(ranked, packed_left), len(ranked) - 1)
    return np.where(ranked[found] == packed_left, order[found], -1)


def step_order(steps: pd.DataFrame) -> np.ndarray | None:
    """The permutation that sorts the rows by run, worker and step (stable), or None
    where a key is empty."""
    keys = steps[["run", "worker", "step"]]
    if keys.isna().to_numpy().any():
        return None
    run = sorted_codes(keys["run"])[0]
    worker, step = (keys[name].to_numpy(dtype="int64") for name in ("worker", "step"))
    return np.lexsort((step, worker, run))


def worker_blocks(steps: pd.DataFrame) -> dict[tuple, tuple[int, int]] | None:
    """Where each run's worker's rows are, ``(run, worker) -> (first, end)``, where
    each one's rows are contiguous (sorted steps); else None."""
    if steps.empty or steps["run"].hasnans or steps["worker"].hasnans:
        return None
    run, uniques = sorted_codes(steps["run"])
    worker = steps["worker"].to_numpy(dtype="int64")
    starts = np.flatnonzero(np.diff(run, prepend=-1) | np.diff(worker, prepend=worker[0] - 1))
    ends = np.append(starts[1:], len(steps))
    blocks = {
        (uniques[run[first]], int(worker[first])): (int(first), int(end))
        for first, end in zip(starts, ends, strict=True)
    }
    return blocks if len(blocks) == len(starts) else None


def in_step_order(steps: pd.DataFrame) -> bool:
    """Whether the rows are sorted by run, worker and step already (what a stable sort
    would leave as it is)."""
    keys = steps[["run", "worker", "step"]]
    if len(keys) < 2 or keys.isna().to_numpy().any():
        return len(keys) < 2
    run = pd.factorize(keys["run"], sort=True)[0]
    worker, step = (keys[name].to_numpy(dtype="int64") for name in ("worker", "step"))
    same_run, same_worker = run[1:] == run[:-1], worker[1:] == worker[:-1]
    ordered = (run[1:] > run[:-1]) | same_run & (
        (worker[1:] > worker[:-1]) | same_worker & (step[1:] >= step[:-1])
    )
    return bool(ordered.all())


def sorted_blocks(frame: pd.DataFrame, keys: list[str]) -> tuple[np.ndarray, np.ndarray] | None:
    """Where the rows are sorted by ``keys`` (the run first, then integer keys) with
    no key empty: the first row of each block of equal keys, and each row's block;
    else None."""
    if frame.empty or frame[keys].isna().to_numpy().any():
        return None
    run, _ = pd.factorize(frame[keys[0]], sort=True)
    others = [frame[name] for name in keys[1:]]
    if not all(column.dtype.kind in "iu" for column in others):
        return None
    columns = [run, *(column.to_numpy() for column in others)]
    later = np.zeros(len(frame) - 1, dtype=bool)  # the row after is in a later block
    same = np.ones(len(frame) - 1, dtype=bool)
    for values in columns:
        if (same & (values[1:] < values[:-1])).any():
            return None  # not sorted
        later |= same & (values[1:] > values[:-1])
        same &= values[1:] == values[:-1]
    starts = np.flatnonzero(np.append(True, later))
    group = np.cumsum(np.append(True, later)) - 1
    return starts, group


def run_codes(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.Index | None]:
    """The frame with its run ids as integer codes (in the order the ids sort) and the
    ids: a grouping by run hashes each row's string; by code it orders the groups as by
    id. Where an id is empty, the frame as it is and None (the grouping leaves those
    rows out)."""
    if frame["run"].hasnans:
        return frame, None
    codes, runs = pd.factorize(frame["run"], sort=True)
    return frame.assign(run=codes), pd.Index(runs, name="run")


def with_run_ids(index: pd.MultiIndex, runs: pd.Index | None) -> pd.MultiIndex:
    """A grouping's index by run code and more with the run ids (``run_codes``) back."""
    if runs is None:
        return index
    return index.set_levels(runs.take(index.levels[0]), level="run")
