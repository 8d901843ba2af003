"""Records -> the report's frames: runs, steps (with the profiled marks, the breakdown,
GPU utilization and the cross-worker columns), replicas, windows, GPU and CPU readings,
batching findings, workers and restarts.

Pure functions over the frames of the records, one per record type
(``records_by_type``); ``report_frames`` runs them in order and gives what ``Report``
holds, and ``load_frames`` reads the files first (``Report.from_files``, and the runner
for ``RunAdvisor``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from functools import partial

import numpy as np
import pandas as pd

from keras_dp_tools.analysis import workers as worker_analysis
from keras_dp_tools.analysis.utilization import step_gpu_utilization
from keras_dp_tools.records import columns as schema
from keras_dp_tools.records.fields import SCALING_FIELDS
from keras_dp_tools.records.reader import read_records_by_type

# The last scaling plan a run recorded (kdt.plan_scaling / BatchScalingCheck(plan=...)).
PLAN_COLUMNS = [name for name in SCALING_FIELDS if name.startswith("plan_")]
RUN_COLUMNS = [
    "run",
    "worker",
    "workers",
    "time",
    "hostname",
    "pid",
    "strategy",
    "replicas",
    "devices",
    "global_batch",
    "steps_per_execution",
    "keras_package",
    "keras_version",
    "tf_version",
    "python_version",
    "keras_dp_tools_version",
    "embedding_layers",
    "embedding_names",
    # How the run id was chosen (capture.job_identity) and, for runs merged on load
    # (analysis.jobs), the id the header was recorded under.
    "run_id_source",
    "cluster",
    "run_id_agreement_ms",
    "recorded_run",
    *schema.GPU_STATUS_COLUMNS,
    *PLAN_COLUMNS,
    "source",
]
# The step records' columns of Report.steps (StepTimer's), with the run header's
# replicas and global batch and the profiled mark.
TIMED_STEP_COLUMNS = [
    "run",
    "worker",
    "epoch",
    "step",
    "steps",
    "replicas",
    "global_batch",
    "step_ms",
    "examples_per_s",
    "warmup",
    "profiled",
    "time",
]
# What the profiler's step_breakdown records add to each step ("trace_step_ms" is the
# step as the trace marks it; "step_ms" stays the host wall time of StepTimer).
# Every column the analysis emits per step (keras_dp_tools.records.columns) reaches the report.
BREAKDOWN_COLUMNS = [
    "trace_step_ms",
    "window",  # the index of the profiler window whose trace gave the row
    # compute_ms ... bandwidth_note, per step, averaged over replicas ("steps" and
    # "step_ms" are the step record's own; "replicas" comes from the run header).
    *[name for name in schema.STEP_COLUMNS if name not in ("step", "replicas", "steps", "step_ms")],
    *schema.XPROF_COLUMNS,
]
# Where GpuMonitor ran: mean utilization of the GPUs over the step (see Report.gpu).
MONITOR_COLUMNS = ["gpu_util_mean"]
# Report.replicas: the replica_step records, with the window index that gave them.
REPLICA_FRAME_COLUMNS = ["run", "worker", "window", *schema.REPLICA_COLUMNS]
WINDOW_COLUMNS = [
    "run",
    "worker",
    "window",  # the window's index (null if skipped)
    "start_step",
    "end_step",
    "status",
    "reason",
    "steps_analysed",
    "stop_ms",
    "analysis_end",
    "allreduce_bytes",
    "sparse_bytes",
    "gather_bytes",
    # The rest of the run's facts the window was analysed with (records.facts.RunFacts).
    "local_replicas",
    "replicas_in_sync",
    "devices",
    "global_batch",
    "steps_per_execution",
    "steps_covered",
    "attribution",
    "profile_run",
    "trace",
    "time",
    "source",
]
# What worker_view reads of the steps.
_WORKER_VIEW_INPUT = ["run", "worker", "attempt", "step", "steps", "time", "step_ms", "warmup"]
# Columns that must be complete in every step record.
_STEP_INTEGERS = ("worker", "epoch", "step", "steps")


def load_frames(files: Iterable[tuple[str | os.PathLike, int]]) -> dict:
    """``report_frames`` of the records files, each read from a byte offset."""
    return report_frames(records_by_type(files))


def records_by_type(files: Iterable[tuple[str | os.PathLike, int]]) -> dict[str, pd.DataFrame]:
    """The records of the files (each read from its byte offset: the first line of a
    run), one frame per record type, each row with the ``source`` file it came from."""
    by_type: dict[str, list[pd.DataFrame]] = {}
    for path, start in files:
        for record_type, frame in read_records_by_type(path, start).items():
            by_type.setdefault(record_type, []).append(frame.assign(source=str(path)))
    return {
        record_type: pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
        for record_type, frames in by_type.items()
    }


def report_frames(records: Mapping[str, pd.DataFrame]) -> dict:
    """The frames of ``Report`` (its constructor's arguments) from the records by type.
    ``workers`` is a function: the worker view (a median per attempt over every step)
    is computed when first asked for."""
    gpu = of_type(records, "gpu_sample", schema.GPU_SAMPLE_COLUMNS)
    gpu = gpu.sort_values(["run", "worker", "time"])
    windows = windows_frame(records)
    starts = worker_analysis.attempts(
        of_type(records, "header", ["run", "worker", "time", "pid", "hostname"])
    )
    runs = runs_frame(records)
    steps = with_gpu_utilization(mark_profiled(steps_frame(records, runs), windows), gpu)
    steps = worker_analysis.assign_attempts(steps, starts)
    sync = worker_analysis.cross_worker_sync(steps)
    steps = worker_analysis.with_worker_wait(steps, sync)
    steps = worker_analysis.with_job_step_ms(steps)
    fit_ends = of_type(records, "fit_end", ["run", "worker", "time", "step", "status"])
    exits = of_type(records, "worker_exit", ["run", "worker", "time", "exit_code", "reason"])
    return {
        "runs": runs,
        "steps": steps,
        "replicas": replicas_frame(records),
        "windows": windows,
        "gpu": gpu.reset_index(drop=True),
        "cpu": of_type(records, "cpu_sample", schema.CPU_SAMPLE_COLUMNS).reset_index(drop=True),
        "batching": of_type(
            records, "batching_finding", schema.BATCHING_FINDING_COLUMNS
        ).reset_index(drop=True),
        "workers": partial(
            worker_analysis.worker_view,
            steps[_WORKER_VIEW_INPUT],  # its own view: later edits of .steps do not leak
            starts,
            fit_ends,
            sync,
            exits,
        ),
        "restarts": worker_analysis.restarts(steps, starts),
    }


def of_type(records: Mapping[str, pd.DataFrame], record_type: str, columns) -> pd.DataFrame:
    """Records of one type with the given columns; fields no record had are empty."""
    frame = records.get(record_type)
    if frame is None:
        return pd.DataFrame(columns=columns)
    return frame.reindex(columns=columns)


def runs_frame(records: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per run and worker: its header, with the latest GPU status and scaling
    plan it recorded."""
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


def mark_profiled(steps: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """Flags steps that ran inside a captured profiler window, or while its analysis
    ran in the background."""
    profiled = pd.Series(False, index=steps.index)
    captured = windows[windows["status"] != "skipped"]
    for window_row in captured.itertuples():
        mine = (steps["run"] == window_row.run) & (steps["worker"] == window_row.worker)
        inside = steps["step"].between(window_row.start_step, window_row.end_step - 1)
        during = pd.Series(False, index=steps.index)
        if pd.notna(window_row.analysis_end):
            during = steps["time"].between(window_row.time, window_row.analysis_end)
        profiled |= mine & (inside | during)
    return steps.assign(profiled=profiled)


def with_gpu_utilization(steps: pd.DataFrame, gpu: pd.DataFrame) -> pd.DataFrame:
    """Adds ``gpu_util_mean``: the mean utilization of the worker's GPUs over each step
    (empty without GpuMonitor readings)."""
    if gpu.empty:
        return steps.assign(gpu_util_mean=float("nan"))
    per_step = step_gpu_utilization(gpu, steps)
    mean = per_step.groupby(["run", "worker", "step"], as_index=False)["gpu_util"].mean()
    mean = mean.rename(columns={"gpu_util": "gpu_util_mean"})
    return steps.merge(mean, on=["run", "worker", "step"], how="left")


def steps_frame(records: Mapping[str, pd.DataFrame], runs: pd.DataFrame) -> pd.DataFrame:
    """One row per worker and step record, with the breakdown of the profiled ones and
    the run header's replicas and global batch, sorted by run, worker and step."""
    steps = of_type(
        records, "step", [c for c in TIMED_STEP_COLUMNS if c not in ("replicas", "global_batch")]
    )
    breakdown = of_type(
        records,
        "step_breakdown",
        ["run", "worker", "step", "time", "steps", "step_ms", *BREAKDOWN_COLUMNS[1:]],
    ).rename(columns={"step_ms": "trace_step_ms", "time": "breakdown_time", "steps": "trace_steps"})
    if not breakdown.empty:  # outer: a run profiled without StepTimer still lists its steps
        steps = steps.merge(breakdown, on=["run", "worker", "step"], how="outer")
        steps["time"] = steps["time"].fillna(steps.pop("breakdown_time"))
        steps["steps"] = steps["steps"].fillna(steps.pop("trace_steps"))
    steps = _with_header_fields(steps, runs[["run", "worker", "replicas", "global_batch"]])
    for column in _STEP_INTEGERS:
        if not steps[column].hasnans:
            steps[column] = steps[column].astype("int64")
    # Only now the breakdown columns no record filled (all of them in a run without a
    # profiler): the merge and the sort need not carry them.
    steps = steps.reindex(columns=TIMED_STEP_COLUMNS + BREAKDOWN_COLUMNS)
    if not _in_step_order(steps):  # one worker writes its steps in order: mostly no sort
        steps = steps.sort_values(["run", "worker", "step"], kind="stable")
    return steps.reset_index(drop=True)


def _with_header_fields(steps: pd.DataFrame, headers: pd.DataFrame) -> pd.DataFrame:
    """Each step with its run header's fields: a left merge on run and worker, or (the
    same, without hashing every step's keys) a copy where one header covers them all."""
    keys = ["run", "worker"]
    if len(headers) == 1:
        run, worker = headers[keys].iloc[0]
        covered = (steps["run"].eq(run) & steps["worker"].eq(worker)).fillna(False).all()
        if covered:
            fields = headers.drop(columns=keys).take(np.zeros(len(steps), dtype=np.intp))
            return steps.assign(**fields.set_axis(steps.index))
    return steps.merge(headers, on=keys, how="left")


def _in_step_order(steps: pd.DataFrame) -> bool:
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


def replicas_frame(records: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per profiled step and replica (``REPLICA_FRAME_COLUMNS``)."""
    rows = of_type(records, "replica_step", REPLICA_FRAME_COLUMNS)
    return rows.sort_values(["run", "worker", "step", "replica"]).reset_index(drop=True)


def windows_frame(records: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per profiler window, with its outcome (``WINDOW_COLUMNS``)."""
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
