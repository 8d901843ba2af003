"""The worker view: one row per run, worker and attempt (steps recorded, how its fit
and process ended, clock offset, median wait for the others, host time between calls,
how often it entered a step last), and the straggler the others waited for most.

Pure functions over the frames of a run (``analysis.clocks`` gives the waits); no
TensorFlow.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from keras_dp_tools.analysis.step_keys import run_codes, sorted_blocks, warmup_mask, with_run_ids

# The columns this analysis adds to Report.steps (restarts and cross-worker waiting).
WORKER_STEP_COLUMNS = [
    "attempt",  # the process that recorded the step: 0, then 1 after a restart, ...
    "redone",  # a later attempt ran this step again (it resumed from an earlier checkpoint)
    "worker_wait_ms",  # multi-worker: waited for the last worker to enter the step
    "last_worker",  # multi-worker: the worker that entered the step last
    "job_step_ms",  # multi-worker: the job's step time, shared step end to the next
]


WORKER_COLUMNS = [
    "run",
    "worker",
    "attempt",
    "pid",
    "hostname",
    "first_step",
    "last_step",
    "step_records",
    "ended",
    "exit",
    "exit_code",  # the process's status where the launcher recorded it (negative: signal)
    "clock_offset_ms",
    "clock_residual_ms",
    "median_worker_wait_ms",
    "median_host_gap_ms",
    "last_to_enter_share",
]


def worker_view(
    steps: pd.DataFrame,
    starts: pd.DataFrame,
    fit_ends: pd.DataFrame,
    sync: pd.DataFrame,
    exits: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """One row per run, worker and attempt (``WORKER_COLUMNS``): the worker view.

    Each row: the steps it recorded, how its fit ended (``finished``; ``exited`` when the
    process left inside the fit, an exception; empty when it recorded no end: killed, or
    still running), how its process ended where ``keras-dp launch --log-dir`` recorded it
    (``exit``, and its status ``exit_code``), its clock offset and alignment residual,
    the median time it waited for other workers, its median host time between train
    calls, and how often it was the last to enter.

    Args:
        steps: the steps' own columns (``run, worker, attempt, step, steps, time,
            step_ms, warmup``).
        starts: ``attempts.attempts`` of the headers.
        fit_ends: the ``fit_end`` records (``run, worker, time, step, status``).
        sync: ``clocks.cross_worker_sync`` of the steps.
        exits: the launcher's ``worker_exit`` records, if any.

    Returns:
        A DataFrame with ``WORKER_COLUMNS``, by run, worker and attempt.
    """
    if steps.empty and starts.empty:
        return pd.DataFrame(columns=WORKER_COLUMNS)
    covered = steps[["run", "worker", "attempt", "step", "time"]].assign(
        last=steps["step"] + steps["steps"].fillna(1) - 1
    )
    recorded, group = _by_attempt(covered)
    # The grouping's codes follow recorded's rows (computed once for both).
    recorded["median_host_gap_ms"] = _host_gaps(steps, group, recorded)
    view = starts.set_index(["run", "worker", "attempt"]).join(recorded, how="outer")
    view = view.reset_index()
    view["ended"] = _endings(view, fit_ends)
    if exits is not None and not exits.empty:  # the launcher's word, for the last attempt
        last = exits.drop_duplicates(["run", "worker"], keep="last")
        last = last.astype({"worker": "int64"}).rename(columns={"reason": "exit"})
        latest = ~view.duplicated(["run", "worker"], keep="last")
        ended = last[["run", "worker", "exit", "exit_code"]]
        view = view.merge(ended, on=["run", "worker"], how="left")
        view.loc[~latest.to_numpy(), ["exit", "exit_code"]] = None
    if not sync.empty:
        coded, runs = run_codes(sync)  # millions of rows: grouped by run code
        per_worker = coded.groupby(["run", "worker"]).agg(
            clock_offset_ms=("clock_offset_ms", "first"),
            clock_residual_ms=("clock_residual_ms", "first"),
            median_worker_wait_ms=("worker_wait_ms", "median"),
        )
        per_worker.index = with_run_ids(per_worker.index, runs)
        last = coded.drop_duplicates(["run", "step"])
        share = last.groupby("run")["last_worker"].value_counts(normalize=True).rename("share")
        share.index = with_run_ids(share.index, runs)
        share = share.reset_index()
        share = share.rename(columns={"last_worker": "worker"}).set_index(["run", "worker"])
        per_worker = per_worker.join(share["share"].rename("last_to_enter_share"))
        view = view.merge(per_worker.reset_index(), on=["run", "worker"], how="left")
    view = view.reindex(columns=WORKER_COLUMNS)
    view["last_to_enter_share"] = view["last_to_enter_share"].astype("float64")
    view["exit_code"] = view["exit_code"].astype("Int64")
    view.loc[view["median_worker_wait_ms"].notna(), "last_to_enter_share"] = view[
        "last_to_enter_share"
    ].fillna(0.0)
    return view.sort_values(["run", "worker", "attempt"]).reset_index(drop=True)


def _endings(view: pd.DataFrame, fit_ends: pd.DataFrame) -> list:
    endings = []
    following = view.groupby(["run", "worker"])["time"].shift(-1)  # next attempt's start
    for row, until in zip(view.itertuples(), following, strict=True):
        ends = fit_ends[(fit_ends["run"] == row.run) & (fit_ends["worker"] == row.worker)]
        if pd.notna(row.time):  # this attempt's ends: after its start, before the next
            ends = ends[ends["time"] >= row.time]
        if pd.notna(until):
            ends = ends[ends["time"] < until]
        if pd.notna(row.last_step_time):  # a later fit of the process that never ended
            ends = ends[ends["time"] >= row.last_step_time]
        endings.append(ends["status"].iloc[-1] if len(ends) else None)
    return endings


def _by_attempt(covered: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """Per run, worker and attempt (sorted): the first and last step covered, the step
    records and the last one's time; and each row's group there. Sorted steps are
    reduced in their blocks (no grouping on three keys); others grouped."""
    keys = ["run", "worker", "attempt"]
    blocks = sorted_blocks(covered, keys)
    if blocks is None:
        by_attempt = covered.groupby(keys)
        recorded = by_attempt.agg(
            first_step=("step", "min"),
            last_step=("last", "max"),
            step_records=("step", "size"),
            last_step_time=("time", "max"),
        )
        return recorded, by_attempt.ngroup().to_numpy()
    starts, group = blocks
    first = covered.iloc[starts]
    index = pd.MultiIndex.from_arrays([first[name] for name in keys], names=keys)

    def reduced(name, ufunc):  # fmin, fmax: NaN left out, as the grouping does
        column = covered[name]
        values = ufunc.reduceat(column.to_numpy(dtype="float64", na_value=np.nan), starts)
        return values.astype(column.dtype) if column.dtype.kind in "iu" else values

    recorded = pd.DataFrame(
        {
            "first_step": reduced("step", np.fmin),
            "last_step": reduced("last", np.fmax),
            "step_records": np.diff(np.append(starts, len(covered))),
            "last_step_time": reduced("time", np.fmax),
        },
        index=index,
    )
    return recorded, group


def _host_gaps(steps: pd.DataFrame, group: np.ndarray, recorded: pd.DataFrame) -> np.ndarray:
    """Per attempt (row of ``recorded``; ``group`` numbers each step's row there): the
    median time between one train call's return and the next call (callbacks,
    Python-side work of the training loop) in ms, NaN with fewer than two timed steps."""
    timed = (~warmup_mask(steps) & steps["time"].notna() & steps["step_ms"].notna()).to_numpy()
    step = steps["step"].to_numpy(dtype="float64", na_value=np.nan)[timed]
    group = group[timed]
    ordered = (group[1:] > group[:-1]) | (group[1:] == group[:-1]) & (step[1:] >= step[:-1])
    # By attempt, then step: sorted steps are in that order already (no sort of millions).
    order = None if ordered.all() else np.lexsort((step, group))
    if order is not None:
        group, step = group[order], step[order]
    same = group[1:] == group[:-1]
    if (same & (step[1:] == step[:-1])).any():  # which of two equal steps is first is moot
        rows = recorded.index.to_frame(index=False).itertuples()
        return np.array([_host_gap(steps, row) for row in rows], dtype="float64")

    def column(name):
        values = steps[name].to_numpy(dtype="float64", na_value=np.nan)[timed]
        return values if order is None else values[order]

    start = column("time")
    end = start + column("step_ms") * column("steps") / 1e3
    gap = (start[1:] - end[:-1])[same] * 1e3
    return _block_medians(gap, group[1:][same], len(recorded))


def _block_medians(values: np.ndarray, group: np.ndarray, groups: int) -> np.ndarray:
    """The median of the values of each group ``0 .. groups - 1`` (NaN left out; NaN
    where a group has none), for ``group`` sorted ascending: one slice per group."""
    medians = np.full(groups, np.nan)
    bounds = np.searchsorted(group, np.arange(groups + 1))
    for number, (first, end) in enumerate(itertools.pairwise(bounds)):
        mine = values[first:end]
        mine = mine[~np.isnan(mine)]
        if len(mine):
            medians[number] = np.median(mine)
    return medians


def _host_gap(steps: pd.DataFrame, row) -> float:
    """``_host_gaps`` of one attempt, where it recorded a step twice."""
    mine = steps[(steps["run"] == row.run) & (steps["worker"] == row.worker)]
    mine = mine[(mine["attempt"] == row.attempt) & ~warmup_mask(mine)]
    mine = mine.dropna(subset=["time", "step_ms"]).sort_values("step")
    if len(mine) < 2:
        return float("nan")
    end = mine["time"] + mine["step_ms"] * mine["steps"].astype("float64") / 1e3
    gap = (mine["time"].shift(-1) - end).iloc[:-1] * 1e3
    return float(gap.median())


def straggler(view: pd.DataFrame, steps: pd.DataFrame) -> dict | None:
    """The worker the others waited for most, with the evidence, or None.

    ``why`` is ``host`` when the worker spends longer between train calls than the
    others (its callbacks or Python-side work), ``input`` or ``compute`` when its own
    profiled steps show it, else ``unknown``.

    Args:
        view: the worker view (``worker_view``, ``Report.workers``).
        steps: the profiled steps (``input_ms`` and ``compute_ms`` are read).

    Returns:
        None with fewer than two timed workers; else a dict: ``run``, ``worker``,
        ``last_share``, ``others_wait_ms``, ``clock_residual_ms``, ``why``, ``detail``.
    """
    timed = view.dropna(subset=["median_worker_wait_ms"])
    if timed["worker"].nunique() < 2:
        return None
    latest = timed.drop_duplicates(["run", "worker"], keep="last")
    slow = latest.sort_values("last_to_enter_share").iloc[-1]
    others = latest[latest["worker"] != slow["worker"]]
    waited = others["median_worker_wait_ms"].median()
    result = {
        "run": slow["run"],
        "worker": int(slow["worker"]),
        "last_share": float(slow["last_to_enter_share"]),
        "others_wait_ms": float(waited),
        "clock_residual_ms": float(latest["clock_residual_ms"].max()),
        "why": "unknown",
        "detail": "",
    }
    gap, other_gap = slow["median_host_gap_ms"], others["median_host_gap_ms"].median()
    if pd.notna(gap) and pd.notna(other_gap) and gap - other_gap > 0.5 * waited:
        result["why"] = "host"
        result["detail"] = (
            f"it spends {gap:.1f} ms between train calls (callbacks, Python-side work) "
            f"against {other_gap:.1f} ms on the others"
        )
        return result
    parts = [part for part in ("input_ms", "compute_ms") if part in steps]
    steps = steps[["run", "worker", *parts]]  # not a copy of every column, twice
    mine = steps[(steps["run"] == slow["run"]) & (steps["worker"] == slow["worker"])]
    theirs = steps[(steps["run"] == slow["run"]) & (steps["worker"] != slow["worker"])]
    for part in ("input_ms", "compute_ms"):
        if part in steps and mine[part].notna().any() and theirs[part].notna().any():
            extra = mine[part].median() - theirs[part].median()
            if extra > 0.5 * waited:
                result["why"] = part.removesuffix("_ms")
                result["detail"] = f"its profiled {part} is {extra:.1f} ms above the others'"
                return result
    return result
