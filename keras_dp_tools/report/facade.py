"""Report: the records of one or many runs as pandas DataFrames.

Pure analysis: reads the JSON Lines records (see ``docs/records.md``) and needs no
TensorFlow, so it works in a notebook on a machine that never trained anything.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from keras_dp_tools.analysis import workers as worker_analysis
from keras_dp_tools.records import columns as schema
from keras_dp_tools.records.files import SCALING_FIELDS, find_record_files, read_records_by_type

GPU_STATUS_COLUMNS = ["gpu_available", "gpu_reason", "gpu_names", "gpu_pci_bus_ids"]
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
    *GPU_STATUS_COLUMNS,
    *PLAN_COLUMNS,
    "source",
]
STEP_COLUMNS = [
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
# Restarts and cross-worker waiting (keras_dp_tools.analysis.workers), after the rest.
WORKER_STEP_COLUMNS = [
    "attempt",  # the process that recorded the step: 0, then 1 after a restart, ...
    "redone",  # a later attempt ran this step again (it resumed from an earlier checkpoint)
    "worker_wait_ms",  # multi-worker: waited for the last worker to enter the step
    "last_worker",  # multi-worker: the worker that entered the step last
]
# What the profiler's step_breakdown records add to each step ("trace_step_ms" is the
# step as the trace marks it; "step_ms" stays the host wall time of StepTimer).
# Every column the analysis emits per step (keras_dp_tools.records.columns) reaches the report.
BREAKDOWN_COLUMNS = [
    "trace_step_ms",
    "window",  # the profiler window whose trace gave the row
    # compute_ms ... bandwidth_note, per step, averaged over replicas ("steps" and
    # "step_ms" are the step record's own; "replicas" comes from the run header).
    *[name for name in schema.STEP_COLUMNS if name not in ("step", "replicas", "steps", "step_ms")],
    *schema.XPROF_COLUMNS,
]
# Where GpuMonitor ran: mean utilization of the GPUs over the step (see .gpu).
MONITOR_COLUMNS = ["gpu_util_mean"]
GPU_COLUMNS = ["run", "worker", "gpu", "time", "sampling", *schema.READING_FIELDS]
BATCHING_COLUMNS = ["run", "worker", "time", "severity", "code", "message", "fix"]
CPU_COLUMNS = ["run", "worker", "time", "process_cpu_percent", "system_cpu_percent", "cpu_count"]
REPLICA_COLUMNS = ["run", "worker", "window", *schema.REPLICA_COLUMNS]
WINDOW_COLUMNS = [
    "run",
    "worker",
    "window",
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


class Report:
    """Records of one or more runs, loaded with ``Report.load``.

    Attributes:
        runs: one row per run and worker, from the run headers (strategy, replicas,
            devices, global batch, versions, host, start ``time`` in Unix seconds).
        steps: one row per worker and recorded train-function call; ``step`` is the
            global step (``optimizer.iterations``) it started at and ``steps`` how
            many steps it covers (more than 1 with ``steps_per_execution``);
            ``step_ms`` is wall time per step. ``warmup`` rows include tracing and
            compilation. ``profiled`` rows ran while a profiler window was captured or
            analysed, which slows steps: the summary's step times leave them out.
            Steps inside a profiler window also carry the breakdown
            (``BREAKDOWN_COLUMNS``: compute, all-reduce, sync wait, shares, averaged
            over replicas); other steps leave those columns empty. With GpuMonitor,
            ``gpu_util_mean`` is the GPUs' mean utilization over the step.
        replicas: one row per profiled step and replica (``REPLICA_COLUMNS``): the
            breakdown of each replica, for finding stragglers.
        windows: one row per profiler window: its steps, ``status`` (``analysed``,
            ``skipped``, ``failed`` with a ``reason``), and the capture's name in
            TensorBoard's Profile tab (``profile_run``) and file (``trace``).
        gpu: GpuMonitor's readings (``GPU_COLUMNS``), one row per GPU and reading;
            ``sampling`` is ``poll`` (every field) or ``buffer`` (the driver's
            utilization buffer). ``runs.gpu_available`` / ``gpu_reason`` say why it
            is empty.
        cpu: host CPU usage readings (``CPU_COLUMNS``; 100% = one core).
        batching: findings of the batching check before the first step (severity,
            code, message, fix), from ``BatchScalingCheck``.
        workers: one row per run, worker and attempt (``worker_analysis.WORKER_COLUMNS``): steps
            recorded, how its fit ended (``finished``, ``exited``, or empty: killed or
            still running), clock offset and alignment residual, median wait for other
            workers, and how often it entered a step last (the straggler view).
        restarts: one row per restart of a worker under the same run id (e.g. after
            ``BackupAndRestore``): where it resumed and how many steps it ran again.

    Example:

    ```python
    import keras_dp_tools as kdt

    report = kdt.Report.load("runs/demo-20261129-093000")
    print(report.summary())
    report.steps.plot(x="step", y="step_ms")
    ```
    """

    def __init__(
        self,
        runs: pd.DataFrame,
        steps: pd.DataFrame,
        replicas: pd.DataFrame | None = None,
        windows: pd.DataFrame | None = None,
        gpu: pd.DataFrame | None = None,
        cpu: pd.DataFrame | None = None,
        batching: pd.DataFrame | None = None,
        workers: pd.DataFrame | Callable[[], pd.DataFrame] | None = None,
        restarts: pd.DataFrame | None = None,
    ):
        def frame(given, columns):
            return pd.DataFrame(columns=columns) if given is None else given

        self.runs = runs
        self.steps = steps
        self.replicas = frame(replicas, REPLICA_COLUMNS)
        self.windows = frame(windows, WINDOW_COLUMNS)
        self.gpu = frame(gpu, GPU_COLUMNS)
        self.cpu = frame(cpu, CPU_COLUMNS)
        self.batching = frame(batching, BATCHING_COLUMNS)
        # load passes a function: the worker view is computed on first access.
        self._workers = (
            workers if callable(workers) else frame(workers, worker_analysis.WORKER_COLUMNS)
        )
        self.restarts = frame(restarts, worker_analysis.RESTART_COLUMNS)

    @property
    def workers(self) -> pd.DataFrame:
        """One row per run, worker and attempt (see the class's Attributes); ``load``
        computes it on first access (a median per attempt over every step)."""
        if callable(self._workers):
            self._workers = self._workers()
        return self._workers

    @workers.setter
    def workers(self, frame: pd.DataFrame) -> None:
        self._workers = frame

    def __repr__(self) -> str:
        return (
            f"Report(runs={self.runs['run'].nunique()}, workers={len(self.runs)}, "
            f"step_records={len(self.steps)})"
        )

    @classmethod
    def load(cls, sources: str | os.PathLike | Iterable[str | os.PathLike]) -> Report:
        """Loads every records file under one or more log dirs (searched recursively)
        or ``.jsonl`` paths, merging runs and workers.

        Raises:
            FileNotFoundError: a path does not exist, or holds no records.
        """
        return cls.from_files((path, 0) for path in find_record_files(sources))

    @classmethod
    def from_files(cls, files: Iterable[tuple[str | os.PathLike, int]]) -> Report:
        """A Report of the given records files, each read from a byte offset (the first
        line of a run, ``Recorder.run_offset``: ``RunAdvisor`` reads its run's records
        without the runs before it)."""
        by_type: dict[str, list[pd.DataFrame]] = {}
        for path, start in files:
            for record_type, frame in read_records_by_type(path, start).items():
                by_type.setdefault(record_type, []).append(frame.assign(source=str(path)))
        records = {
            record_type: pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
            for record_type, frames in by_type.items()
        }
        gpu = _of_type(records, "gpu_sample", GPU_COLUMNS).sort_values(["run", "worker", "time"])
        windows = _windows(records)
        starts = worker_analysis.attempts(
            _of_type(records, "header", ["run", "worker", "time", "pid", "hostname"])
        )
        runs = _runs(records)
        steps = _with_gpu_utilization(_mark_profiled(_steps(records, runs), windows), gpu)
        steps = worker_analysis.assign_attempts(steps, starts)
        sync = worker_analysis.cross_worker_sync(steps)
        steps = _with_worker_wait(steps, sync)
        fit_ends = _of_type(records, "fit_end", ["run", "worker", "time", "step", "status"])
        return cls(
            runs,
            steps,
            _replicas(records),
            windows,
            gpu.reset_index(drop=True),
            _of_type(records, "cpu_sample", CPU_COLUMNS).reset_index(drop=True),
            _of_type(records, "batching_finding", BATCHING_COLUMNS).reset_index(drop=True),
            partial(
                worker_analysis.worker_view,
                steps[_WORKER_VIEW_INPUT],  # its own view: later edits of .steps do not leak
                starts,
                fit_ends,
                sync,
                _of_type(records, "worker_exit", ["run", "worker", "time", "exit_code", "reason"]),
            ),
            worker_analysis.restarts(steps, starts),
        )

    def gpu_by_epoch(self) -> pd.DataFrame:
        """Per run, worker, epoch and GPU: mean utilization over the epoch's steps, mean
        SM activity and power, peak memory (``keras_dp_tools.analysis.utilization``)."""
        from keras_dp_tools.analysis.utilization import epoch_gpu_summary

        return epoch_gpu_summary(self.gpu, self.steps)

    def gpu_findings(self) -> list[str]:
        """Notes where NVML utilization is possibly misleading (SM activity much lower)."""
        from keras_dp_tools.analysis.utilization import utilization_findings

        return utilization_findings(self.gpu)

    def summary(self, advice: bool = True) -> pd.DataFrame:
        """One row per run: replicas, global batch, steps and step-time statistics, and
        the medians of the profiled steps' breakdown where a profiler ran.

        ``steps`` counts the steps after warm-up; the step-time statistics
        (``median_step_ms``, ``p90_step_ms``, ``examples_per_s``: medians over steps)
        use the ``measured_steps`` among them that no profiler disturbed (``profiled``
        steps are left out), and the breakdown medians the ``breakdown_steps`` a
        profiler window analysed. ``advice`` lists the titles of ``advice()`` for the
        run (``advice=False`` leaves it out).
        """
        if self.steps.empty:
            return pd.DataFrame(columns=["start", "workers", "replicas", "steps"])
        steps = self.steps[~self.steps["warmup"].fillna(False).astype(bool)]
        steps = steps[~steps["redone"].astype(bool)]  # a restart ran them again: count once
        grouped = steps.groupby("run", sort=False)
        measured = steps[~steps["profiled"]]
        timed = measured.groupby("run", sort=False)
        analysed = steps[steps["trace_step_ms"].notna()]

        def count(frame):  # every worker records every step: count one worker's
            per_worker = frame["steps"].fillna(1).groupby([frame["run"], frame["worker"]]).sum()
            return per_worker.groupby("run").max().reindex(grouped.size().index, fill_value=0)

        summary = pd.DataFrame(
            {
                "workers": grouped["worker"].nunique(),
                "replicas": grouped["replicas"].first(),
                "global_batch": grouped["global_batch"].first(),
                "steps": count(steps),
                "measured_steps": count(measured),
                "breakdown_steps": count(analysed),
                "median_step_ms": timed["step_ms"].median(),
                "p90_step_ms": timed["step_ms"].quantile(0.9),
                "examples_per_s": timed["examples_per_s"].median(),
                **{name: grouped[name].median() for name in _SUMMARY_BREAKDOWN},
                "gpu_util": grouped["gpu_util_mean"].mean(),
            }
        )
        started = self.runs.groupby("run")["time"].min()
        summary.insert(0, "start", pd.to_datetime(started.reindex(summary.index), unit="s"))
        if advice:
            from keras_dp_tools.analysis.advice import AdvisorFrames, advise

            frames = AdvisorFrames.of(self)
            summary["advice"] = [
                "; ".join(item.title for item in advise(frames.for_run(run)))
                for run in summary.index
            ]
        return summary.sort_values("start")

    def text(self) -> str:
        """The summary (a column per run), the scaling table when the runs differ in
        replicas, and the advice, as plain text for terminals and logs."""
        if self.steps.empty:
            return self._no_steps_text()
        summary = self.summary(advice=False)
        numbers = summary.select_dtypes("number").columns
        summary[numbers] = summary[numbers].round(3)
        summary["start"] = summary["start"].dt.floor("s")
        parts = ["Summary (warm-up and profiled steps left out of step times):"]
        with pd.option_context("display.width", 160, "display.max_columns", 30):
            parts.append(summary.T.to_string())
            if self.steps["replicas"].nunique() > 1:
                parts += ["", "Scaling:", self.compare().round(3).to_string(index=False)]
        parts += self._worker_text()
        advice = self.advice()
        parts += ["", "Advice:" if advice else "Advice: nothing stands out in the numbers."]
        parts += [str(item) for item in advice]
        return "\n".join(parts)

    def _no_steps_text(self) -> str:
        if self.runs.empty:
            return (
                "No runs recorded yet: the records file(s) are empty. The job stopped (or "
                "is still starting) before keras_dp_tools wrote its run header."
            )
        runs = ", ".join(self.runs["run"].drop_duplicates())
        return (
            f"Run {runs} has no steps yet: the job stopped (or is still starting) before "
            f"its first training step finished ({len(self.runs)} worker header(s) recorded)."
        )

    def _worker_text(self) -> list[str]:
        """Workers that stopped, restarts, and the straggler view, where there are any."""
        parts = []
        stopped = worker_analysis.stopped_workers(self.workers)
        if stopped:
            parts += ["", "Workers that stopped before the end of fit:", *stopped]
        for row in self.restarts.itertuples():
            parts += [
                "",
                f"Restart: run {row.run} worker {row.worker} attempt {row.attempt} resumed "
                f"at step {row.resumed_at_step} (the previous attempt recorded up to step "
                f"{row.previous_last_step}; {row.redone_steps} step(s) ran again).",
            ]
        timed = self.workers.dropna(subset=["median_worker_wait_ms"])
        if not timed.empty:
            columns = [
                "run",
                "worker",
                "median_worker_wait_ms",
                "last_to_enter_share",
                "median_host_gap_ms",
                "clock_offset_ms",
                "clock_residual_ms",
            ]
            parts += [
                "",
                "Workers (wait for the last worker to enter a step, on clocks aligned at "
                "the step ends):",
                timed[columns].round(3).to_string(index=False),
            ]
        return parts

    def for_run(self, run: str) -> Report:
        """The part of this report that belongs to one run id."""
        frames = {
            name: frame[frame["run"] == run].reset_index(drop=True)
            for name, frame in self._frames().items()
        }
        return Report(**frames)

    def _frames(self) -> dict[str, pd.DataFrame]:
        return {
            "runs": self.runs,
            "steps": self.steps,
            "replicas": self.replicas,
            "windows": self.windows,
            "gpu": self.gpu,
            "cpu": self.cpu,
            "batching": self.batching,
            "workers": self.workers,
            "restarts": self.restarts,
        }

    def compare(self) -> pd.DataFrame:
        """Runs side by side by replica count: throughput, speed-up and scaling efficiency.

        ``speedup`` is throughput over that of the run with the fewest replicas (1, in a
        sweep from 1), and ``scaling_efficiency`` is ``throughput_N / (N / N0 ×
        throughput_N0)``: 1.0 is perfect linear scaling. With several runs at one replica
        count, the latest counts. Throughput is examples/s where the global batch is
        known, else steps/s.
        """
        summary = self.summary(advice=False)
        summary = summary.dropna(subset=["replicas"]).drop_duplicates("replicas", keep="last")
        summary = summary.sort_values("replicas")
        throughput = summary["examples_per_s"].where(
            summary["examples_per_s"].notna(), 1000.0 / summary["median_step_ms"]
        )
        base = summary.iloc[0] if len(summary) else None
        table = pd.DataFrame(
            {
                "run": summary.index,
                "replicas": summary["replicas"].astype("int64").to_numpy(),
                "global_batch": summary["global_batch"].to_numpy(),
                "median_step_ms": summary["median_step_ms"].to_numpy(),
                "throughput": throughput.to_numpy(),
                "comm_share": summary["comm_share"].to_numpy(),
                "wait_share": summary["wait_share"].to_numpy(),
            }
        )
        if base is not None:
            base_throughput = table["throughput"].iloc[0]
            table["speedup"] = table["throughput"] / base_throughput
            ideal = table["replicas"] / int(base["replicas"])
            table["scaling_efficiency"] = table["speedup"] / ideal
        return table.reset_index(drop=True)

    def advice(self) -> list:
        """Findings with their evidence and a concrete fix, worst first
        (``keras_dp_tools.analysis.advice``)."""
        from keras_dp_tools.analysis.advice import advise

        several = self.steps["replicas"].nunique() > 1
        return advise(self, scaling=self.compare() if several else None)

    def to_csv(self, directory: str | os.PathLike) -> list[Path]:
        """Writes every frame (and the summary) as ``<directory>/<name>.csv``."""
        return self._export(directory, "csv", lambda frame, path: frame.to_csv(path, index=False))

    def to_parquet(self, directory: str | os.PathLike) -> list[Path]:
        """Writes every frame (and the summary) as ``<directory>/<name>.parquet``;
        needs a parquet engine (pyarrow, installed with keras_dp_tools)."""
        try:
            import pyarrow.parquet  # noqa: F401
        except ImportError as error:
            raise RuntimeError(
                f"to_parquet needs pyarrow's parquet support ({error}); use to_csv instead."
            ) from None
        return self._export(
            directory, "parquet", lambda frame, path: frame.to_parquet(path, index=False)
        )

    def _export(self, directory, suffix, write) -> list[Path]:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        frames = {**self._frames(), "summary": self.summary(advice=False).reset_index()}
        written = []
        for name, frame in frames.items():
            path = directory / f"{name}.{suffix}"
            write(_flat(frame), path)
            written.append(path)
        return written


_SUMMARY_BREAKDOWN = schema.HEADLINE_COLUMNS


def _flat(frame: pd.DataFrame) -> pd.DataFrame:
    """Lists (devices, GPU names) as text: CSV has no lists, and parquet wants one type."""

    def text(value):
        return ",".join(map(str, value)) if isinstance(value, (list, tuple, np.ndarray)) else value

    listed = [
        column
        for column in frame.columns
        if frame[column].map(lambda value: isinstance(value, (list, tuple, np.ndarray))).any()
    ]
    return frame.assign(**{column: frame[column].map(text) for column in listed})


def _of_type(records: dict, record_type: str, columns: list[str]) -> pd.DataFrame:
    """Records of one type with the given columns; fields no record had are empty."""
    frame = records.get(record_type)
    if frame is None:
        return pd.DataFrame(columns=columns)
    return frame.reindex(columns=columns)


def _runs(records: dict) -> pd.DataFrame:
    merged = (*GPU_STATUS_COLUMNS, *PLAN_COLUMNS)
    runs = _of_type(records, "header", [c for c in RUN_COLUMNS if c not in merged])
    runs = runs.drop_duplicates(["run", "worker"], keep="last")
    for record_type, columns in (
        ("gpu_status", GPU_STATUS_COLUMNS),
        ("scaling_plan", PLAN_COLUMNS),
    ):
        latest = _of_type(records, record_type, ["run", "worker", *columns])
        latest = latest.drop_duplicates(["run", "worker"], keep="last")  # the latest word
        runs = runs.merge(latest, on=["run", "worker"], how="left")
    runs = runs[RUN_COLUMNS]
    return runs.sort_values(["time", "worker"]).reset_index(drop=True)


def _mark_profiled(steps: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """Flags steps that ran inside a captured profiler window, or while its analysis
    ran in the background."""
    profiled = pd.Series(False, index=steps.index)
    captured = windows[windows["status"] != "skipped"]
    for window in captured.itertuples():
        mine = (steps["run"] == window.run) & (steps["worker"] == window.worker)
        inside = steps["step"].between(window.start_step, window.end_step - 1)
        during = pd.Series(False, index=steps.index)
        if pd.notna(window.analysis_end):
            during = steps["time"].between(window.time, window.analysis_end)
        profiled |= mine & (inside | during)
    return steps.assign(profiled=profiled)


def _with_gpu_utilization(steps: pd.DataFrame, gpu: pd.DataFrame) -> pd.DataFrame:
    if gpu.empty:
        return steps.assign(gpu_util_mean=float("nan"))
    from keras_dp_tools.analysis.utilization import step_gpu_utilization

    per_step = step_gpu_utilization(gpu, steps)
    mean = per_step.groupby(["run", "worker", "step"], as_index=False)["gpu_util"].mean()
    mean = mean.rename(columns={"gpu_util": "gpu_util_mean"})
    return steps.merge(mean, on=["run", "worker", "step"], how="left")


def _steps(records: dict, runs: pd.DataFrame) -> pd.DataFrame:
    steps = _of_type(
        records, "step", [c for c in STEP_COLUMNS if c not in ("replicas", "global_batch")]
    )
    breakdown = _of_type(
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
    steps = steps.reindex(columns=STEP_COLUMNS + BREAKDOWN_COLUMNS)
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


def _replicas(records: dict) -> pd.DataFrame:
    rows = _of_type(records, "replica_step", REPLICA_COLUMNS)
    return rows.sort_values(["run", "worker", "step", "replica"]).reset_index(drop=True)


def _windows(records: dict) -> pd.DataFrame:
    rows = _of_type(records, "window", WINDOW_COLUMNS)
    # A window records "open" when it starts and its outcome when it closes; one that
    # never closed was cut short with its process (the capture was never written).
    numbered = rows["window"].notna()
    closed = numbered & rows.duplicated(["run", "worker", "window", "start_step"], keep="last")
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


def _with_worker_wait(steps: pd.DataFrame, sync: pd.DataFrame) -> pd.DataFrame:
    """Adds each step's wait for other workers and, in profiled steps, moves it from
    ``transfer_ms`` (where a worker's own trace shows it) to ``sync_wait_ms``."""
    if sync.empty:
        return steps.assign(worker_wait_ms=float("nan"), last_worker=pd.NA)
    steps = steps.drop(columns=["worker_wait_ms", "last_worker"], errors="ignore").merge(
        sync[["run", "worker", "step", "worker_wait_ms", "last_worker"]],
        on=["run", "worker", "step"],
        how="left",
    )
    steps["last_worker"] = steps["last_worker"].astype("Int64")
    wait = steps["worker_wait_ms"].fillna(0.0)
    old_transfer = steps["transfer_ms"].astype("float64")
    for total, waited in (
        ("transfer_ms", "sync_wait_ms"),
        ("exposed_transfer_ms", "exposed_sync_wait_ms"),
    ):
        moved = np.minimum(wait, steps[total].astype("float64")).where(steps[total].notna())
        steps[total] = steps[total] - moved.fillna(0.0)
        steps[waited] = steps[waited] + moved.fillna(0.0)
        if total == "transfer_ms":  # every local replica waited that long for the worker
            steps["max_sync_wait_ms"] = steps["max_sync_wait_ms"] + moved.fillna(0.0)
    profiled = steps["trace_step_ms"]
    steps["comm_share"] = (steps["exposed_transfer_ms"] / profiled).where(profiled > 0)
    steps["wait_share"] = (steps["exposed_sync_wait_ms"] / profiled).where(profiled > 0)
    faster = old_transfer / steps["transfer_ms"].astype("float64")  # bandwidth ~ 1 / time
    for name in ("algbw_gbps", "busbw_gbps"):
        steps[name] = (steps[name] * faster).where(steps["transfer_ms"] > 0)
    return steps
