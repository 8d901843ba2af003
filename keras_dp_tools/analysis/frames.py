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
import pyarrow as pa
import pyarrow.compute as pc

from keras_dp_tools.analysis import workers as worker_analysis
from keras_dp_tools.analysis.utilization import step_gpu_utilization
from keras_dp_tools.records import columns as schema
from keras_dp_tools.records.fields import SCALING_FIELDS
from keras_dp_tools.records.reader import read_record_tables, record_frame

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
    "global_batch_source",  # where global_batch came from (capture.run_info)
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
    "examples",
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
    return _report_frames(records_by_type(files))  # its own records: freed once used


def records_by_type(files: Iterable[tuple[str | os.PathLike, int]]) -> dict[str, pd.DataFrame]:
    """The records of the files (each read from its byte offset: the first line of a
    run), one frame per record type, each row but the steps' with the ``source`` file
    it came from (no frame shows a step's source; 64 workers x 100,000 steps would
    hold 6.4 million copies of it)."""
    by_type: dict[str, list[tuple[str, pa.Table]]] = {}
    for path, start in files:
        for record_type, table in read_record_tables(path, start).items():
            by_type.setdefault(record_type, []).append((str(path), table))
    # Each type's tables are let go once converted (the steps' are most of the memory).
    return {
        record_type: _records_frame(record_type, by_type.pop(record_type))
        for record_type in list(by_type)
    }


def _records_frame(record_type: str, parts: list[tuple[str, pa.Table]]) -> pd.DataFrame:
    """One record type's tables of several files as one frame."""
    tables = [table for _, table in parts]
    if record_type == "step" and all(table.schema == tables[0].schema for table in tables):
        # One conversion of the tables joined in Arrow (no copy there): converting each
        # and concatenating the frames held every step twice.
        joined = pa.concat_tables(_by_worker(tables))
        parts.clear()
        del tables
        return record_frame(joined)
    frames = []
    for path, table in parts:
        frame = record_frame(table)
        frames.append(frame if record_type == "step" else frame.assign(source=path))
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]


def _by_worker(tables: list[pa.Table]) -> list[pa.Table]:
    """The step tables by worker number where each holds one worker's steps, another
    worker's than the rest (files come as worker-0, worker-1, worker-10, ...): joined
    in that order, the steps are sorted already, and ``timed_steps`` does not reorder
    millions of rows. Else as they are. (No two tables share a worker, so their order
    does not change what the stable sort by run, worker and step gives.)"""
    workers = []
    for table in tables:
        if "worker" not in table.column_names:
            return tables
        column = table.column("worker")
        if not pa.types.is_integer(column.type) or len(column) == 0 or column.null_count:
            return tables
        low, high = pc.min_max(column).values()
        if low != high:
            return tables
        workers.append(low.as_py())
    if len(set(workers)) < len(workers):
        return tables
    order = sorted(range(len(tables)), key=workers.__getitem__)
    return [tables[index] for index in order]


def report_frames(records: Mapping[str, pd.DataFrame]) -> dict:
    """The frames of ``Report`` (its constructor's arguments) from the records by type.
    ``workers`` is a function: the worker view (a median per attempt over every step)
    is computed when first asked for."""
    return _report_frames(dict(records))


def report_frames_handed_over(records: dict[str, pd.DataFrame]) -> dict:
    """``report_frames`` of records the caller hands over (``Report.load``): their
    step records are dropped from ``records`` once the steps are built (at 64 workers x
    100,000 steps they hold 0.7 GB, and a copy of the dict kept them all along)."""
    return _report_frames(records)


def _report_frames(records: dict[str, pd.DataFrame]) -> dict:
    """``report_frames``, dropping the step records from ``records`` once the steps
    are built (at 64 workers x 100,000 steps, they hold 0.7 GB)."""
    gpu = of_type(records, "gpu_sample", schema.GPU_SAMPLE_COLUMNS)
    gpu = gpu.sort_values(["run", "worker", "time"])
    windows = windows_frame(records)
    starts = worker_analysis.attempts(
        of_type(records, "header", ["run", "worker", "time", "pid", "hostname"])
    )
    runs = runs_frame(records)
    # Every step-wide pass below runs on the step records' dozen columns; the
    # breakdown's ~35 columns join last, on the rows that have one (at 64 workers x
    # 100,000 steps, each pass over a wide frame cost seconds and gigabytes).
    steps, breakdown = timed_steps(records, runs)
    records.pop("step", None)
    steps = with_gpu_utilization(mark_profiled(steps, windows), gpu)
    steps = worker_analysis.assign_attempts(steps, starts)
    # One set of clock tables for the sync and the job's step times (with_breakdown
    # keeps the rows and the columns they read).
    clocks = worker_analysis.clock_tables(steps)
    sync = worker_analysis.cross_worker_sync_of(clocks)
    steps = with_breakdown(steps, breakdown, sync)
    steps = steps.with_all(worker_analysis.with_job_step_ms(steps.all, clocks))
    del clocks
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
            steps.all[_WORKER_VIEW_INPUT],  # its own view: later edits of .steps do not leak
            starts,
            fit_ends,
            sync,
            exits,
        ),
        "restarts": worker_analysis.restarts(steps.all, starts),
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


def _number(value) -> float:
    """A window bound as a float; NaN where it is missing (None, NaN, pd.NA)."""
    return float("nan") if pd.isna(value) else float(value)


def mark_profiled(steps: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """Flags steps that ran inside a captured profiler window, or while its analysis
    ran in the background."""
    captured = windows[windows["status"] != "skipped"]
    blocks = _worker_blocks(steps)
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
    """Adds ``gpu_util_mean``: the mean utilization of the worker's GPUs over each step
    (empty without GpuMonitor readings)."""
    if gpu.empty:
        return steps.assign(gpu_util_mean=float("nan"))
    per_step = step_gpu_utilization(gpu, steps)
    mean = per_step.groupby(["run", "worker", "step"], as_index=False)["gpu_util"].mean()
    mean = mean.rename(columns={"gpu_util": "gpu_util_mean"})
    return steps.merge(mean, on=["run", "worker", "step"], how="left")


def timed_steps(
    records: Mapping[str, pd.DataFrame], runs: pd.DataFrame
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The steps' own columns (``TIMED_STEP_COLUMNS``, the run header's replicas and
    global batch included), one row per worker and step record, sorted by run, worker
    and step; and the profiler's breakdown of the steps that have one
    (``BREAKDOWN_COLUMNS``), which ``with_breakdown`` adds. ``_breakdown`` holds each
    step's row there (-1: none). A step_breakdown record without its step record (a run
    profiled without StepTimer) still lists its step."""
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
    if not _in_step_order(steps):  # one worker writes its steps in order
        order = _step_order(steps)
        steps = steps.sort_values(keys, kind="stable") if order is None else steps.take(order)
    steps = steps.reset_index(drop=True)
    steps = _with_header_fields(steps, runs[["run", "worker", "replicas", "global_batch"]])
    for column in _STEP_INTEGERS:
        if not steps[column].hasnans:
            steps[column] = steps[column].astype("int64")
    return steps[[*TIMED_STEP_COLUMNS, "_breakdown"]], breakdown


class StepParts:
    """``Report.steps`` in two parts, as the analysis reads it: ``all``, every step
    with the columns of its own (all but ``BREAKDOWN_COLUMNS``), and ``profiled``, the
    rows with a breakdown with every column. At 64 workers x 100,000 steps the wide
    frame holds ~35 columns that are empty on all but a few hundred rows (2.5 GB);
    ``wide()`` builds it when a user asks for ``Report.steps``.

    Args:
        all: every step, without the breakdown's columns (or the wide frame itself).
        rows: the positions in ``all`` of the steps with a breakdown, ascending.
        breakdown: the breakdown's columns of those rows (one row each, in order), or
            None where ``all`` is the wide frame.

    Example:

    ```python
    import keras_dp_tools as kdt
    from keras_dp_tools.analysis.frames import step_parts

    parts = step_parts(kdt.Report.load("runs/demo").steps)
    print(len(parts.all), parts.profiled["comm_share"].median())
    ```
    """

    def __init__(self, all: pd.DataFrame, rows: np.ndarray, breakdown: pd.DataFrame | None):
        self.all, self.rows, self.breakdown = all, rows, breakdown
        self._profiled: pd.DataFrame | None = None
        self._measured_rows: tuple | None = None

    @classmethod
    def of_frame(cls, steps: pd.DataFrame) -> StepParts:
        """The parts of a wide steps frame (a ``Report`` made with one, ``for_run``):
        ``all`` is the frame itself."""
        present = [name for name in BREAKDOWN_COLUMNS if name in steps]
        rows = np.flatnonzero(steps[present].notna().to_numpy().any(axis=1))
        return cls(steps, rows, None)

    def with_all(self, all: pd.DataFrame) -> StepParts:
        """These parts with ``all`` replaced by a frame of the same rows (columns added)."""
        return StepParts(all, self.rows, self.breakdown)

    @property
    def profiled(self) -> pd.DataFrame:
        """The rows with a breakdown, every column of ``Report.steps``."""
        if self._profiled is None:
            mine = self.all.iloc[self.rows].reset_index(drop=True)
            if self.breakdown is not None:
                breakdown = self.breakdown.reset_index(drop=True)
                if len(self.rows) < len(self.all):  # typed as the wide frame's columns
                    gap, one = np.array([-1]), pd.RangeIndex(1)
                    filled = {name: _taken(breakdown[name], gap, one).dtype for name in breakdown}
                    breakdown = breakdown.astype(filled)
                mine = pd.concat([mine, breakdown], axis=1)[self._order()]
            self._profiled = mine
        return self._profiled

    def measured(self, disturbed: bool = False) -> pd.DataFrame:
        """``workers.measured_step_times`` of every step; the steps it groups are
        grouped once (the summary and each advice read it)."""
        if self._measured_rows is None:
            self._measured_rows = worker_analysis._measured_step_rows(self.all)
        return worker_analysis._measured_step_times(self._measured_rows, disturbed)

    def wide(self) -> pd.DataFrame:
        """``Report.steps``: every step with every column (the breakdown's empty on the
        steps that have none)."""
        if self.breakdown is None:
            return self.all
        position = np.full(len(self.all), -1)
        position[self.rows] = np.arange(len(self.rows))
        index = self.all.index
        columns = {
            name: _taken(self.breakdown[name], position, index)
            if name in BREAKDOWN_COLUMNS
            else self.all[name]
            for name in self._order()
        }
        # copy=False: the columns are fresh or all's; stacking ~50 columns of millions
        # of rows into one block took seconds.
        return pd.DataFrame(columns, copy=False)

    def for_run(self, run: str) -> StepParts:
        """The steps of one run id (``all`` itself where it holds that run alone)."""
        mine = (self.all["run"] == run).to_numpy()
        if mine.all():
            return self
        kept = mine[self.rows]
        breakdown = None if self.breakdown is None else self.breakdown[kept]
        rows = np.cumsum(mine)[self.rows[kept]] - 1  # positions among the run's rows
        return StepParts(self.all[mine].reset_index(drop=True), rows, breakdown)

    def __len__(self) -> int:
        return len(self.all)

    def _order(self) -> list[str]:
        later = [name for name in self.all.columns if name not in TIMED_STEP_COLUMNS]
        return [*TIMED_STEP_COLUMNS, *BREAKDOWN_COLUMNS, *later]


def step_parts(steps: pd.DataFrame | StepParts) -> StepParts:
    """``steps`` (``Report.steps``, or its parts already) as ``StepParts``."""
    return steps if isinstance(steps, StepParts) else StepParts.of_frame(steps)


def steps_of(frames) -> StepParts:
    """The steps of a ``Report`` (its ``step_parts``: the wide frame is not built) or
    of anything with a ``steps`` frame or parts (``AdvisorFrames``)."""
    parts = getattr(frames, "step_parts", None)
    return parts if parts is not None else step_parts(frames.steps)


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


def with_breakdown(steps: pd.DataFrame, breakdown: pd.DataFrame, sync: pd.DataFrame) -> StepParts:
    """``timed_steps``' steps with the breakdown's columns after their own (empty where
    a step has none) and each step's wait for other workers (``cross_worker_sync``):
    ``workers.with_worker_wait`` on the steps with a breakdown (where it also moves
    that wait from ``transfer_ms`` to ``sync_wait_ms``), a join for the others. In
    parts (``StepParts``): the wide frame is built when it is asked for."""
    rows = steps["_breakdown"].to_numpy()
    steps = steps.drop(columns="_breakdown")
    later = [name for name in steps.columns if name not in TIMED_STEP_COLUMNS]
    order = [*TIMED_STEP_COLUMNS, *BREAKDOWN_COLUMNS, *later]
    # By run, step and worker: the order cross_worker_sync gives its rows (no sort).
    at_sync = None if sync.empty else _positions(steps, sync, ["run", "step", "worker"])

    def plain() -> pd.DataFrame:  # every column of every step, then the wait
        wide = steps.reindex(columns=order)
        if not breakdown.empty:
            for name in BREAKDOWN_COLUMNS:
                wide[name] = _taken(breakdown[name], rows, wide.index)
        return StepParts.of_frame(worker_analysis.with_worker_wait(wide, sync))

    if breakdown.empty or (at_sync is None and not sync.empty):
        return plain()
    profiled = np.flatnonzero(rows >= 0)
    some = pd.concat(
        [
            steps.iloc[profiled].reset_index(drop=True),
            breakdown[BREAKDOWN_COLUMNS].iloc[rows[profiled]].reset_index(drop=True),
        ],
        axis=1,
    )[order]
    near = sync if sync.empty else sync[sync["step"].isin(some["step"])]
    some = worker_analysis.with_worker_wait(some, near)
    columns = {name: steps[name] for name in TIMED_STEP_COLUMNS}
    columns.update({name: steps[name] for name in later})
    if sync.empty:  # the wait's columns, empty, as with_worker_wait gives them
        own = worker_analysis.with_worker_wait(pd.DataFrame(columns, copy=False), sync)
    else:
        added = [name for name in some.columns if name not in order]
        if set(added) - set(sync.columns):  # with_worker_wait adds more than the join has
            return plain()
        for name in added:  # typed as with_worker_wait types them
            columns[name] = _taken(sync[name], at_sync, steps.index).astype(some[name].dtype)
        own = pd.DataFrame(columns, copy=False)
    return StepParts(own, profiled, some[BREAKDOWN_COLUMNS])


def _taken(column: pd.Series, positions: np.ndarray, index: pd.Index) -> pd.Series:
    """``column``'s values at ``positions`` (-1: empty) as a series on ``index``."""
    # A float column: NaN, then the values at their rows (a take with a fill cost
    # ~0.3 s a column at 6.4 million rows).
    if isinstance(column.dtype, np.dtype) and column.dtype.kind == "f":
        values = np.full(len(positions), np.nan, dtype=column.dtype)
        found = positions >= 0
        values[found] = column.to_numpy()[positions[found]]
        return pd.Series(values, index=index, name=column.name, copy=False)
    return pd.Series(column.array.take(positions, allow_fill=True), index=index, name=column.name)


def _with_header_fields(steps: pd.DataFrame, headers: pd.DataFrame) -> pd.DataFrame:
    """Each step with its run header's fields: a left merge on run and worker, found
    without hashing every step's keys where it can be."""
    keys = ["run", "worker"]
    at = _positions(steps, headers, keys)
    if at is None:
        return steps.merge(headers, on=keys, how="left")
    fields = {name: _taken(headers[name], at, steps.index) for name in headers if name not in keys}
    return steps.assign(**fields)


def _codes(values: pd.Series) -> tuple[np.ndarray, pd.Index]:
    """Integer codes of the values, in the order the values sort (run ids)."""
    codes, uniques = pd.factorize(values, sort=True)
    return codes, pd.Index(uniques)


def _positions(left: pd.DataFrame, right: pd.DataFrame, keys: list[str]) -> np.ndarray | None:
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
            values, uniques = _codes(left[name])
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


def _step_order(steps: pd.DataFrame) -> np.ndarray | None:
    """The permutation that sorts the rows by run, worker and step (stable), or None
    where a key is empty."""
    keys = steps[["run", "worker", "step"]]
    if keys.isna().to_numpy().any():
        return None
    run = _codes(keys["run"])[0]
    worker, step = (keys[name].to_numpy(dtype="int64") for name in ("worker", "step"))
    return np.lexsort((step, worker, run))


def _worker_blocks(steps: pd.DataFrame) -> dict[tuple, tuple[int, int]] | None:
    """Where each run's worker's rows are, ``(run, worker) -> (first, end)``, where
    each one's rows are contiguous (sorted steps); else None."""
    if steps.empty or steps["run"].hasnans or steps["worker"].hasnans:
        return None
    run, uniques = _codes(steps["run"])
    worker = steps["worker"].to_numpy(dtype="int64")
    starts = np.flatnonzero(np.diff(run, prepend=-1) | np.diff(worker, prepend=worker[0] - 1))
    ends = np.append(starts[1:], len(steps))
    blocks = {
        (uniques[run[first]], int(worker[first])): (int(first), int(end))
        for first, end in zip(starts, ends, strict=True)
    }
    return blocks if len(blocks) == len(starts) else None


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
