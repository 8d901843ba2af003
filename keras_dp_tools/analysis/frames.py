"""Records -> a run's frames: the runs, the steps' own columns and their profiler
breakdown, the profiled marks and GPU utilization of each step, replicas and windows.
``analysis.run_frames.load_run_frames`` calls them in order.

Pure functions over the records by type (``analysis.record_tables``); no TensorFlow.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from keras_dp_tools.analysis.frame_columns import (
    BREAKDOWN_COLUMNS,
    PLAN_COLUMNS,
    REPLICA_FRAME_COLUMNS,
    RUN_COLUMNS,
    TIMED_STEP_COLUMNS,
    WINDOW_COLUMNS,
)
from keras_dp_tools.analysis.record_tables import of_type
from keras_dp_tools.analysis.step_keys import (
    in_step_order,
    key_positions,
    step_order,
    taken,
    worker_blocks,
)
from keras_dp_tools.analysis.utilization import step_gpu_utilization
from keras_dp_tools.records import columns as schema

# Columns that must be complete in every step record.
_STEP_INTEGERS = ("worker", "epoch", "step", "steps")


def runs_frame(records: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per run and worker: its header, with the latest GPU status and scaling
    plan it recorded.

    Args:
        records: the records by type (``record_tables.records_by_type``).

    Returns:
        A DataFrame with ``RUN_COLUMNS``, by start time and worker.
    """
    merged = (*schema.GPU_STATUS_COLUMNS, *PLAN_COLUMNS)
    runs = of_type(records, "header", [c for c in RUN_COLUMNS if c not in merged])
    runs = runs.drop_duplicates(["run", "worker"], keep="last")
    for record_type, columns in (
        ("gpu_status", schema.GPU_STATUS_COLUMNS),
        ("scaling_plan", PLAN_COLUMNS),
    ):
        latest = of_type(records, record_type, ["run", "worker", *columns])
        latest = latest.drop_duplicates(["run", "worker"], keep="last")  # the latest word
        runs = runs.merge(latest, on=["run", "worker"], how="left")
    runs = runs[RUN_COLUMNS]
    return runs.sort_values(["time", "worker"]).reset_index(drop=True)


def _number(value) -> float:
    """A window bound as a float; NaN where it is missing (None, NaN, pd.NA)."""
    return float("nan") if pd.isna(value) else float(value)


def mark_profiled(steps: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """The steps with ``profiled``: whether each ran inside a captured profiler window,
    or while its analysis ran in the background.

    Args:
        steps: the steps' own columns (``timed_steps``), sorted by run, worker and step.
        windows: ``windows_frame``.

    Returns:
        The steps with ``profiled`` (bool).
    """
    captured = windows[windows["status"] != "skipped"]
    blocks = worker_blocks(steps)
    if blocks is not None:  # each window looks at its worker's rows only
        profiled = np.zeros(len(steps), dtype=bool)
        step = steps["step"].to_numpy(dtype="float64", na_value=np.nan)
        time = steps["time"].to_numpy(dtype="float64", na_value=np.nan)
        for window_row in captured.itertuples():
            lo, hi = blocks.get((window_row.run, window_row.worker), (0, 0))
            # A bound the window never recorded (pd.NA: cut short) covers no step, as
            # Series.between says.
            first, end = (_number(window_row.start_step), _number(window_row.end_step))
            inside = (step[lo:hi] >= first) & (step[lo:hi] <= end - 1)
            if pd.notna(window_row.analysis_end):
                inside |= (time[lo:hi] >= window_row.time) & (
                    time[lo:hi] <= window_row.analysis_end
                )
            profiled[lo:hi] |= inside
        return steps.assign(profiled=profiled)
    profiled = pd.Series(False, index=steps.index)
    for window_row in captured.itertuples():
        mine = (steps["run"] == window_row.run) & (steps["worker"] == window_row.worker)
        inside = steps["step"].between(window_row.start_step, window_row.end_step - 1)
        during = pd.Series(False, index=steps.index)
        if pd.notna(window_row.analysis_end):
            during = steps["time"].between(window_row.time, window_row.analysis_end)
        profiled |= mine & (inside | during)
    return steps.assign(profiled=profiled)


def with_gpu_utilization(steps: pd.DataFrame, gpu: pd.DataFrame) -> pd.DataFrame:
    """The steps with ``gpu_util_mean``: the mean utilization of the worker's GPUs over
    each step.

    Args:
        steps: the steps' own columns.
        gpu: GpuMonitor's readings (``GPU_SAMPLE_COLUMNS``).

    Returns:
        The steps with ``gpu_util_mean`` (empty without readings).
    """
    if gpu.empty:
        return steps.assign(gpu_util_mean=float("nan"))
    per_step = step_gpu_utilization(gpu, steps)
    mean = per_step.groupby(["run", "worker", "step"], as_index=False)["gpu_util"].mean()
    mean = mean.rename(columns={"gpu_util": "gpu_util_mean"})
    return steps.merge(mean, on=["run", "worker", "step"], how="left")


def timed_steps(
    records: Mapping[str, pd.DataFrame], runs: pd.DataFrame
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The steps' own columns, and the profiler's breakdown of the steps that have one.

    A step_breakdown record without its step record (a run profiled without StepTimer)
    still lists its step.

    Args:
        records: the records by type.
        runs: ``runs_frame`` (the steps take its replicas and global batch).

    Returns:
        ``(steps, breakdown)``: the steps with ``TIMED_STEP_COLUMNS`` and ``_breakdown``
        (each step's row in ``breakdown``, -1: none), one row per worker and step
        record, sorted by run, worker and step; and the breakdown's columns
        (``BREAKDOWN_COLUMNS``), which ``step_parts.with_breakdown`` adds.
    """
    keys = ["run", "worker", "step"]
    steps = of_type(
        records, "step", [c for c in TIMED_STEP_COLUMNS if c not in ("replicas", "global_batch")]
    )
    breakdown = of_type(
        records,
        "step_breakdown",
        ["run", "worker", "step", "time", "steps", "step_ms", *BREAKDOWN_COLUMNS[1:]],
    ).rename(columns={"step_ms": "trace_step_ms", "time": "breakdown_time", "steps": "trace_steps"})
    own = list(steps.columns)
    if breakdown.empty:
        steps = steps.assign(_breakdown=-1)
    else:  # outer: a run profiled without StepTimer still lists its steps
        # Only the step records of a profiled step number take part in the merge.
        candidate = steps["step"].isin(breakdown["step"]).to_numpy()
        rows = np.flatnonzero(candidate)
        merged = steps.iloc[rows].assign(_row=rows).merge(breakdown, on=keys, how="outer")
        merged["time"] = merged["time"].fillna(merged.pop("breakdown_time"))
        merged["steps"] = merged["steps"].fillna(merged.pop("trace_steps"))
        merged["_breakdown"] = np.arange(len(merged))
        at = merged.pop("_row")
        breakdown = merged.drop(columns=[c for c in own if c not in keys])
        merged = merged[[*own, "_breakdown"]]
        in_place = _merged_in_place(steps, merged, at)
        if in_place is not None:
            steps = in_place
        else:
            rest = steps[~candidate].assign(_breakdown=-1)
            steps = pd.concat([rest, merged], ignore_index=True) if len(rest) else merged
    if not in_step_order(steps):  # one worker writes its steps in order
        order = step_order(steps)
        steps = steps.sort_values(keys, kind="stable") if order is None else steps.take(order)
    steps = steps.reset_index(drop=True)
    steps = _with_header_fields(steps, runs[["run", "worker", "replicas", "global_batch"]])
    for column in _STEP_INTEGERS:
        if not steps[column].hasnans:
            steps[column] = steps[column].astype("int64")
    return steps[[*TIMED_STEP_COLUMNS, "_breakdown"]], breakdown


def _merged_in_place(
    steps: pd.DataFrame, merged: pd.DataFrame, at: pd.Series
) -> pd.DataFrame | None:
    """The steps with the merge's rows written back where they came from (``at``):
    sorted by run, worker and step (stable), what the concatenation of the other steps
    and the merged rows gives, where every merged row came from a step (none only from
    a breakdown), no run, worker and step is there twice among them (the other steps
    have other step numbers: no ties with them), and the merge kept the columns'
    types. Else None. (The concatenation copied every step.)"""
    if at.isna().any() or len(merged) != len(at.unique()):
        return None
    if any(merged[name].dtype != steps[name].dtype for name in steps.columns):
        return None
    keys = merged[["run", "worker", "step"]]
    if keys.isna().to_numpy().any() or keys.duplicated().any():
        return None
    rows = at.to_numpy(dtype="int64")
    breakdown_rows = np.full(len(steps), -1)
    breakdown_rows[rows] = merged["_breakdown"].to_numpy()
    filled = {}
    for name in ("time", "steps"):  # what the merge filled in from the breakdown
        column = steps[name].copy()
        column.iloc[rows] = merged[name].to_numpy()
        filled[name] = column
    return steps.assign(**filled, _breakdown=breakdown_rows)


def _with_header_fields(steps: pd.DataFrame, headers: pd.DataFrame) -> pd.DataFrame:
    """Each step with its run header's fields: a left merge on run and worker, found
    without hashing every step's keys where it can be."""
    keys = ["run", "worker"]
    at = key_positions(steps, headers, keys)
    if at is None:
        return steps.merge(headers, on=keys, how="left")
    fields = {name: taken(headers[name], at, steps.index) for name in headers if name not in keys}
    return steps.assign(**fields)


def replicas_frame(records: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per profiled step and replica.

    Args:
        records: the records by type (``record_tables.records_by_type``).

    Returns:
        A DataFrame with ``REPLICA_FRAME_COLUMNS``, by run, worker, step and replica.
    """
    rows = of_type(records, "replica_step", REPLICA_FRAME_COLUMNS)
    return rows.sort_values(["run", "worker", "step", "replica"]).reset_index(drop=True)


def windows_frame(records: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per profiler window, with its outcome; a window that never closed is
    ``interrupted``.

    Args:
        records: the records by type (``record_tables.records_by_type``).

    Returns:
        A DataFrame with ``WINDOW_COLUMNS``, by run, worker and time.
    """
    rows = of_type(records, "window", WINDOW_COLUMNS)
    # A window records "open" when it starts and its outcome when it closes; one that
    # never closed was cut short with its process (the capture was never written).
    indexed = rows["window"].notna()
    closed = indexed & rows.duplicated(["run", "worker", "window", "start_step"], keep="last")
    rows = rows[~closed]
    open_ = rows["status"] == "open"
    if open_.any():
        rows = rows.assign(
            status=rows["status"].where(~open_, "interrupted"),
            reason=rows["reason"]
            .astype(object)
            .where(
                ~open_, "the process ended inside the window, before the profiler wrote its capture"
            ),
        )
    return rows.sort_values(["run", "worker", "time"]).reset_index(drop=True)
