"""Attempts and restarts: each process that recorded a run's worker (a restart under
the same run id is a new attempt), which attempt recorded each step, and which steps a
later attempt ran again (``redone``).

Pure functions over the record frames; no TensorFlow.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

RESTART_COLUMNS = [
    "run",
    "worker",
    "attempt",
    "time",
    "resumed_at_step",
    "previous_last_step",
    "redone_steps",
]


def attempts(headers: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, worker, attempt): each process that wrote the run's records (a
    restart under the same ``KERAS_DP_RUN_ID`` is a new process), by start time.

    Args:
        headers: the header records' ``run, worker, time, pid, hostname``.

    Returns:
        A DataFrame with ``run, worker, attempt, time, pid, hostname``.
    """
    columns = ["run", "worker", "attempt", "time", "pid", "hostname"]
    if headers.empty:
        return pd.DataFrame(columns=columns)
    started = (
        headers.groupby(["run", "worker", "hostname", "pid"], dropna=False, sort=False)["time"]
        .min()
        .reset_index()
        .sort_values(["run", "worker", "time"], kind="stable")
    )
    started["attempt"] = started.groupby(["run", "worker"]).cumcount()
    started["worker"] = started["worker"].astype("int64")
    return started[columns].reset_index(drop=True)


def assign_attempts(steps: pd.DataFrame, starts: pd.DataFrame) -> pd.DataFrame:
    """The steps with ``attempt`` (the process that recorded the step) and ``redone`` (a
    later attempt ran this step again: it restarted from an earlier checkpoint).

    Args:
        steps: the steps' own columns (``run, worker, time, step``).
        starts: ``attempts`` of the headers.

    Returns:
        The steps with the two columns added.
    """
    starts = starts.dropna(subset=["time"])
    if steps.empty or starts.empty or not starts["attempt"].astype(bool).any():
        # No restart: every step is its worker's attempt 0 (the match below would say
        # so too, at a second per million steps).
        return steps.assign(attempt=0, redone=False)
    # The match needs only these columns, not every one; _row is the step's position.
    keys = steps[["run", "worker", "time"]].assign(_row=np.arange(len(steps)))
    timed = keys.dropna(subset=["time", "worker"])
    timed = timed.sort_values("time", kind="stable")
    timed = timed.astype({"worker": "int64", "time": "float64"})
    matched = pd.merge_asof(
        timed,
        starts[["run", "worker", "time", "attempt"]]
        .astype({"time": "float64"})
        .sort_values("time"),
        on="time",
        by=["run", "worker"],
        direction="backward",
    )
    attempt = np.zeros(len(steps), dtype="int64")
    found = matched["attempt"].notna().to_numpy()
    attempt[matched["_row"].to_numpy()[found]] = matched["attempt"].to_numpy()[found]
    steps = steps.assign(attempt=attempt)
    first = steps.groupby(["run", "worker", "attempt"])["step"].min().rename("first")
    later = first.reset_index().rename(columns={"attempt": "later"})
    later = later.merge(steps[["run", "worker"]].drop_duplicates(), on=["run", "worker"])
    redone = np.zeros(len(steps), dtype=bool)
    for row in later.itertuples():
        redone |= (
            (steps["run"] == row.run)
            & (steps["worker"] == row.worker)
            & (steps["attempt"] < row.later)
            & (steps["step"] >= row.first)
        ).to_numpy()
    return steps.assign(redone=redone)


def restarts(steps: pd.DataFrame, starts: pd.DataFrame) -> pd.DataFrame:
    """One row per restart: where the new attempt resumed, the previous attempt's last
    recorded step, and how many steps it ran again.

    Args:
        steps: steps with ``attempt`` (``assign_attempts``).
        starts: ``attempts`` of the headers.

    Returns:
        A DataFrame with ``RESTART_COLUMNS`` (``Report.restarts``).
    """
    rows = []
    for (run, worker), group in starts.groupby(["run", "worker"], sort=False):
        for previous, current in zip(group.itertuples(), group.iloc[1:].itertuples(), strict=False):
            mine = steps[(steps["run"] == run) & (steps["worker"] == worker)]
            before = mine[mine["attempt"] == previous.attempt]["step"]
            after = mine[mine["attempt"] == current.attempt]["step"]
            resumed = after.min() if len(after) else None
            rows.append(
                {
                    "run": run,
                    "worker": worker,
                    "attempt": current.attempt,
                    "time": current.time,
                    "resumed_at_step": resumed,
                    "previous_last_step": before.max() if len(before) else None,
                    "redone_steps": int((before >= resumed).sum()) if resumed is not None else 0,
                }
            )
    return pd.DataFrame(rows, columns=RESTART_COLUMNS)
