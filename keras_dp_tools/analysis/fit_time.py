"""Whole-``fit`` time accounting: where a fit's wall time went, in the steps or outside.

Pure functions over the records by type (``analysis.record_tables.records_by_type``): the
``step`` records and the edges ``StepTimer`` records once per fit, epoch and validation
(``fit_begin``, ``epoch_begin``, ``epoch_end``, ``validation_begin``,
``validation_end``, ``fit_end``), all on one clock (Unix seconds of the worker's host).

A fit's wall time (``fit_begin`` to ``fit_end``) is cut into the train function's calls
and the gaps between them, and each gap is named by where it lies:

- ``between_steps_s``: gaps between two calls of one epoch (per-batch callbacks, the
  progress bar, host work between calls);
- ``validation_s``: ``validation_begin`` to ``validation_end`` (validation inside fit);
- ``epoch_setup_s``: the other gaps, at the epochs' edges: fit begin to the first call,
  an epoch's last call to the next epoch's first (iterator set-up, epoch-end callbacks,
  checkpoints), the last call to fit's end; less the validation inside them. Two of
  its parts are named: ``epoch_start_s``, each ``epoch_begin`` to the epoch's first
  call (creating the epoch's iterator, callbacks' ``on_epoch_begin`` after
  StepTimer's), and ``epoch_end_s``, each epoch's last call to its ``epoch_end`` less
  the validation (Keras ending the epoch, callbacks' ``on_epoch_end`` before
  StepTimer's: TensorBoard histograms, checkpoints);
- ``first_step_s``: the first call's time beyond its steps at the fit's median pace
  (tracing and compilation);
- ``profiler_stop_s``: our ``DataParallelProfiler`` stopping a window after a call
  (its ``window`` record's ``stop_ms``), taken out of the gap it fell in: the profiler's
  cost, not the training's.

``in_steps_s`` is the calls' time less ``first_step_s`` (the steps at their steady
pace), so ``fit_s = in_steps_s + outside_steps_s`` and ``outside_steps_s =
validation_s + epoch_setup_s + between_steps_s + first_step_s + profiler_stop_s``.
What Keras does in ``fit`` before the first callback hook (adapting the data) is not
in ``fit_s``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

# The records that time a fit's parts (StepTimer), besides the steps.
FIT_EDGE_TYPES = (
    "fit_begin",
    "epoch_begin",
    "epoch_end",
    "validation_begin",
    "validation_end",
    "fit_end",
)
# One row per run, worker and fit call (fit_time_frame).
FIT_TIME_COLUMNS = [
    "run",
    "worker",
    "fit",  # the fit call's index among this worker's fits in the run, from 0
    "status",  # fit_end's: finished, exited; "unended" without one (killed, running)
    "begin_time",  # Unix seconds of fit_begin
    "fit_s",  # fit_begin to fit_end
    "train_calls_s",  # the train function's calls (step records), tracing included
    "in_steps_s",  # train_calls_s less first_step_s: the steps at their steady pace
    "outside_steps_s",  # fit_s - in_steps_s
    "outside_steps_share",  # outside_steps_s / fit_s
    "validation_s",
    "epoch_setup_s",
    "epoch_start_s",  # part of epoch_setup_s: epoch_begin to the epoch's first call
    "epoch_end_s",  # part of epoch_setup_s: the epoch's last call to epoch_end
    "between_steps_s",
    "first_step_s",  # NaN with a single call: no steady pace to compare it with
    "profiler_stop_s",  # our profiler stopping its windows between calls
    "epochs",
    "steps",  # optimizer steps the calls ran
    "steps_per_epoch",
    "train_calls",
    "validations",
    "outside_ms_per_step",  # outside_steps_s over the fit's steps, ms
]
# The parts of the time outside steps, as fit_time_frame names them.
OUTSIDE_PARTS = (
    "validation_s",
    "epoch_setup_s",
    "between_steps_s",
    "first_step_s",
    "profiler_stop_s",
)
_EDGE_COLUMNS = ["run", "worker", "time", "epoch", "type"]
_STEP_COLUMNS = ["run", "worker", "time", "epoch", "step", "steps", "step_ms"]


def fit_time_frame(records: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Splits each fit's wall time into its steps and what lies outside them.

    Args:
        records: the records by type (``analysis.record_tables.records_by_type``): the
            ``step`` frame and the fit-edge frames (``FIT_EDGE_TYPES``) are read; others
            are ignored.

    Returns:
        One row per run, worker and fit call (``FIT_TIME_COLUMNS``), in that order.
        Times in seconds. Numbers are NaN for a fit without ``fit_end``, or with
        ``status`` ``exited`` (its ``fit_end`` was written at the process's exit, not
        when the fit stopped). Empty for records without ``fit_begin`` (written before
        this version, or without ``StepTimer``).

    Example:

    ```python
    import pandas as pd
    from keras_dp_tools.analysis.fit_time import fit_time_frame

    edge = lambda kind, time: {"run": "r", "worker": 0, "time": time, "type": kind}
    records = {
        "fit_begin": pd.DataFrame([edge("fit_begin", 100.0)]),
        "epoch_begin": pd.DataFrame([edge("epoch_begin", 100.5)]),
        "epoch_end": pd.DataFrame([edge("epoch_end", 103.0)]),
        "fit_end": pd.DataFrame([{**edge("fit_end", 103.5), "status": "finished"}]),
        "step": pd.DataFrame(
            {"run": "r", "worker": 0, "time": [101.0, 101.5, 102.0], "epoch": 0,
             "steps": 1, "step_ms": [400.0, 100.0, 100.0]}
        ),
    }
    row = fit_time_frame(records).iloc[0]
    print(row[["fit_s", "first_step_s", "between_steps_s", "epoch_setup_s"]].round(3))
    # 3.5 s in fit: 0.3 s tracing, 0.5 s between steps, 2.4 s at the epoch's edges
    ```
    """
    edges = _edges(records)
    if edges.empty:
        return pd.DataFrame(columns=FIT_TIME_COLUMNS)
    steps = _steps(records)
    step_groups = steps.groupby(["run", "worker"], sort=False).indices if len(steps) else {}
    stops = _profiler_stops(records)
    rows = []
    for (run, worker), worker_edges in edges.groupby(["run", "worker"], sort=True):
        worker_steps = steps.iloc[step_groups.get((run, worker), [])]
        worker_stops = stops[(stops["run"] == run) & (stops["worker"] == worker)]
        rows += _worker_fits(run, worker, worker_edges, worker_steps, worker_stops)
    frame = pd.DataFrame(rows, columns=FIT_TIME_COLUMNS)
    counts = dict.fromkeys(("epochs", "steps", "train_calls", "validations"), "Int64")
    return frame.astype({"worker": "int64", "fit": "int64", **counts})


def fit_time_by_run(fit_time: pd.DataFrame) -> pd.DataFrame:
    """Per run, the fit wall time and the share of it outside the steps, for
    ``Report.summary()``.

    Only finished fits count. ``fit_s`` is the slowest worker's total over its fits
    (the job's wall time in fit); ``outside_steps_share`` is the time outside steps over
    the fit time, summed over every worker and fit.

    Args:
        fit_time: ``fit_time_frame``'s rows.

    Returns:
        A frame indexed by ``run`` with columns ``fit_s``, ``outside_steps_share``
        (runs without a finished fit are absent).
    """
    done = fit_time[fit_time["status"] == "finished"]
    if done.empty:
        return pd.DataFrame(
            {"fit_s": pd.Series(dtype=float), "outside_steps_share": pd.Series(dtype=float)},
            index=pd.Index([], name="run"),
        )
    per_worker = done.groupby(["run", "worker"])[["fit_s", "outside_steps_s"]].sum()
    by_run = per_worker.groupby(level="run")
    totals = by_run.sum()
    return pd.DataFrame(
        {
            "fit_s": by_run["fit_s"].max(),
            "outside_steps_share": totals["outside_steps_s"] / totals["fit_s"],
        }
    )


def _edges(records: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """The fit-edge records of every type, with their ``type`` (and fit_end's
    ``status``), sorted by run, worker and time."""
    columns = [*_EDGE_COLUMNS, "status"]
    if records.get("fit_begin") is None or records["fit_begin"].empty:
        return pd.DataFrame(columns=columns)
    frames = [
        records[kind].assign(type=kind).reindex(columns=columns)
        for kind in FIT_EDGE_TYPES  # in this order: at equal times, fit_begin comes first
        if records.get(kind) is not None and len(records[kind])
    ]
    edges = pd.concat(frames, ignore_index=True).dropna(subset=["run", "worker", "time"])
    return edges.sort_values(["run", "worker", "time"], kind="stable").reset_index(drop=True)


def _steps(records: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """The step records' calls: start and end (Unix seconds), epoch and steps."""
    frame = records.get("step")
    if frame is None or frame.empty:
        return pd.DataFrame(columns=[*_STEP_COLUMNS, "seconds", "end"])
    steps = frame.reindex(columns=_STEP_COLUMNS).dropna(subset=["time", "step_ms"])
    covered = steps["steps"].fillna(1).astype("float64")
    seconds = steps["step_ms"].astype("float64") * covered / 1000.0
    return steps.assign(steps=covered, seconds=seconds, end=steps["time"] + seconds)


def _profiler_stops(records: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Our profiler's window stops: run, worker, the first step after the window
    (``end_step``: the stop came right before its call) and ``stop_ms``."""
    columns = ["run", "worker", "window", "start_step", "end_step", "stop_ms"]
    frame = records.get("window")
    if frame is None or frame.empty:
        return pd.DataFrame(columns=columns)
    stops = frame.reindex(columns=columns).dropna(subset=["end_step", "stop_ms"])
    return stops.drop_duplicates(["run", "worker", "window", "start_step"], keep="last")


def _worker_fits(
    run, worker, edges: pd.DataFrame, steps: pd.DataFrame, stops: pd.DataFrame
) -> list[dict]:
    """The rows of one worker's fits: each fit_begin with the first fit_end after it
    and before the next fit_begin."""
    times = edges["time"].to_numpy(dtype="float64")
    kinds = edges["type"].to_numpy()
    begins = np.flatnonzero(kinds == "fit_begin")
    rows = []
    for index, begin in enumerate(begins):
        stop = begins[index + 1] if index + 1 < len(begins) else len(kinds)
        inside = slice(begin, stop)
        ends = np.flatnonzero(kinds[inside] == "fit_end")
        row = dict.fromkeys(FIT_TIME_COLUMNS, np.nan)
        row.update(run=run, worker=worker, fit=index, begin_time=times[begin])
        if len(ends) == 0:
            row["status"] = "unended"
            rows.append(row)
            continue
        end = begin + ends[0]
        row["status"] = edges["status"].iloc[end]
        if row["status"] == "finished":
            fit_edges = edges.iloc[begin : end + 1]
            start_s, end_s = times[begin], times[end]
            in_fit = steps[(steps["time"] >= start_s) & (steps["time"] <= end_s)]
            calls = in_fit.sort_values("time")
            if calls.empty:  # no step recorded (ParameterServerStrategy): split unknown
                row["fit_s"] = end_s - start_s
            else:
                row.update(_accounting(start_s, end_s, fit_edges, calls, stops))
        rows.append(row)
    return rows


def _accounting(
    start_s: float, end_s: float, edges: pd.DataFrame, calls: pd.DataFrame, stops: pd.DataFrame
) -> dict:
    """The split of one finished fit's wall time (see the module docstring)."""
    fit_s = end_s - start_s
    starts = calls["time"].to_numpy(dtype="float64")
    seconds = calls["seconds"].to_numpy(dtype="float64")
    covered = calls["steps"].to_numpy(dtype="float64")
    epochs_of_calls = calls["epoch"].to_numpy()
    train_calls_s = float(seconds.sum())
    first_step_s = _first_step_excess(calls)
    # Gaps before each call and after the last; a gap inside one epoch is between steps.
    previous_end = np.concatenate([[start_s], starts[:-1] + seconds[:-1]])
    gaps = np.clip(starts - previous_end, 0.0, None)
    profiler_stop_s = _take_profiler_stops(gaps, calls, stops)
    same_epoch = np.zeros(len(gaps), dtype=bool)
    same_epoch[1:] = epochs_of_calls[1:] == epochs_of_calls[:-1]
    tail = max(end_s - (starts[-1] + seconds[-1]), 0.0) if len(starts) else fit_s
    between_steps_s = float(gaps[same_epoch].sum())
    edge_gaps_s = float(gaps[~same_epoch].sum()) + tail
    validation_s, validations = _validation(edges)
    epoch_start_s, epoch_end_s = _epoch_edges(edges, calls)
    in_steps_s = train_calls_s - (0.0 if np.isnan(first_step_s) else first_step_s)
    outside_steps_s = fit_s - in_steps_s
    steps = int(covered.sum())
    epochs = int((edges["type"] == "epoch_begin").sum()) or len(set(epochs_of_calls))
    return {
        "fit_s": fit_s,
        "train_calls_s": train_calls_s,
        "in_steps_s": in_steps_s,
        "outside_steps_s": outside_steps_s,
        "outside_steps_share": outside_steps_s / fit_s if fit_s > 0 else np.nan,
        "validation_s": validation_s,
        "epoch_setup_s": max(edge_gaps_s - validation_s, 0.0),
        "epoch_start_s": epoch_start_s,
        "epoch_end_s": max(epoch_end_s - validation_s, 0.0),
        "between_steps_s": between_steps_s,
        "first_step_s": first_step_s,
        "profiler_stop_s": profiler_stop_s,
        "epochs": epochs,
        "steps": steps,
        "steps_per_epoch": steps / epochs if epochs else np.nan,
        "train_calls": len(calls),
        "validations": validations,
        "outside_ms_per_step": 1000.0 * outside_steps_s / steps if steps else np.nan,
    }


def _take_profiler_stops(gaps: np.ndarray, calls: pd.DataFrame, stops: pd.DataFrame) -> float:
    """Takes each window stop of this fit out of the gap before the call at its
    ``end_step`` (``gaps`` changes in place); returns the seconds taken. A stop with no
    such call in the fit (a window closed when the fit ended) is not in the fit."""
    if stops.empty or calls.empty:
        return 0.0
    where = dict(zip(calls["step"].to_numpy(), range(len(calls)), strict=True))
    taken = 0.0
    for end_step, stop_ms in zip(stops["end_step"], stops["stop_ms"], strict=True):
        index = where.get(end_step)
        if index is not None:
            take = min(float(stop_ms) / 1000.0, gaps[index])
            gaps[index] -= take
            taken += take
    return taken


def _first_step_excess(calls: pd.DataFrame) -> float:
    """The first call's seconds beyond its steps at the median pace of the others
    (tracing and compilation); NaN with no other call to set the pace."""
    if len(calls) < 2:
        return np.nan
    pace_ms = float(calls["step_ms"].iloc[1:].median())
    first = calls.iloc[0]
    return max(float(first["seconds"]) - float(first["steps"]) * pace_ms / 1000.0, 0.0)


def _epoch_edges(edges: pd.DataFrame, calls: pd.DataFrame) -> tuple[float, float]:
    """Seconds from each ``epoch_begin`` to its epoch's first call, and from each
    epoch's last call to its ``epoch_end`` (validation included), over the epochs with
    calls; matched by epoch number (unique within a fit)."""
    if calls.empty:
        return 0.0, 0.0
    by_epoch = calls.assign(end=calls["time"] + calls["seconds"]).groupby("epoch")
    first_start, last_end = by_epoch["time"].min(), by_epoch["end"].max()
    starts = edges[edges["type"] == "epoch_begin"].groupby("epoch")["time"].first()
    ends = edges[edges["type"] == "epoch_end"].groupby("epoch")["time"].last()
    start_s = (first_start - starts).dropna().clip(lower=0.0).sum()
    end_s = (ends - last_end).dropna().clip(lower=0.0).sum()
    return float(start_s), float(end_s)


def _validation(edges: pd.DataFrame) -> tuple[float, int]:
    """Seconds from each ``validation_begin`` to the ``validation_end`` after it, and
    how many validations ended (one that raised has no end and is not counted)."""
    total, count, opened = 0.0, 0, None
    for kind, time in zip(edges["type"], edges["time"], strict=True):
        if kind == "validation_begin":
            opened = time
        elif kind == "validation_end" and opened is not None:
            total += time - opened
            count += 1
            opened = None
    return total, count
