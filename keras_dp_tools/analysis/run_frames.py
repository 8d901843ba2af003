"""One container for a run's frames (``RunFrames``) and the one loader that builds it
from records files (``load_run_frames``): records -> merged jobs -> frames -> joins.

``Report`` wraps a ``RunFrames``; the analyzers (summary, advice, job findings), the
runner for ``RunAdvisor`` and the dashboard take it.

Pure functions over the records; no TensorFlow.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from functools import partial

import pandas as pd

from keras_dp_tools.analysis.attempts import RESTART_COLUMNS, assign_attempts, attempts, restarts
from keras_dp_tools.analysis.clocks import clock_tables, cross_worker_sync_of, with_job_step_ms
from keras_dp_tools.analysis.fit_time import FIT_TIME_COLUMNS, fit_time_frame
from keras_dp_tools.analysis.frame_columns import (
    LOOP_COLUMNS,
    REPLICA_FRAME_COLUMNS,
    WINDOW_COLUMNS,
)
from keras_dp_tools.analysis.frames import (
    mark_profiled,
    replicas_frame,
    runs_frame,
    timed_steps,
    windows_frame,
    with_gpu_utilization,
)
from keras_dp_tools.analysis.jobs import JobMerge, merge_jobs
from keras_dp_tools.analysis.record_tables import of_type, records_by_type
from keras_dp_tools.analysis.step_parts import StepParts, step_parts, with_breakdown
from keras_dp_tools.analysis.workers import WORKER_COLUMNS, worker_view
from keras_dp_tools.records import columns as schema

# The frames of a run, in the order Report lists them.
FRAME_NAMES = ("runs", "steps", "replicas", "windows", "gpu", "cpu", "batching", "workers")
FRAME_NAMES += ("restarts", "fits", "loops")
# What worker_view reads of the steps.
_WORKER_VIEW_INPUT = ["run", "worker", "attempt", "step", "steps", "time", "step_ms", "warmup"]


class RunFrames:
    """The frames of one or more runs, as ``Report`` shows them (see its Attributes).

    Args:
        runs: one row per run and worker (``frame_columns.RUN_COLUMNS``).
        steps: the steps, as the wide frame or in parts (``StepParts``, what
            ``load_run_frames`` gives: the wide frame is built on first access).
        replicas, windows, gpu, cpu, batching, restarts: the other frames; None:
            empty, with their columns.
        fits: where each fit's wall time went (``analysis.fit_time.fit_time_frame``).
        loops: ``kdt.TrainingLoop``'s records: how a custom loop called ``strategy.run``.
        workers: the worker view, or a function that computes it on first access.
        jobs: what the loader found and merged of the log dir's jobs (``JobMerge``).

    Example:

    ```python
    from keras_dp_tools.analysis.run_frames import load_run_frames

    frames = load_run_frames([("runs/demo/keras_dp/worker-0.jsonl", 0)])
    print(len(frames.step_parts), frames.workers)
    ```
    """

    def __init__(
        self,
        runs: pd.DataFrame,
        steps: pd.DataFrame | StepParts,
        replicas: pd.DataFrame | None = None,
        windows: pd.DataFrame | None = None,
        gpu: pd.DataFrame | None = None,
        cpu: pd.DataFrame | None = None,
        batching: pd.DataFrame | None = None,
        workers: pd.DataFrame | Callable[[], pd.DataFrame] | None = None,
        restarts: pd.DataFrame | None = None,
        fits: pd.DataFrame | None = None,
        loops: pd.DataFrame | None = None,
        jobs: JobMerge | None = None,
    ):
        def frame(given, columns):
            return pd.DataFrame(columns=columns) if given is None else given

        self.runs = runs
        self._steps = steps
        self.replicas = frame(replicas, REPLICA_FRAME_COLUMNS)
        self.windows = frame(windows, WINDOW_COLUMNS)
        self.gpu = frame(gpu, schema.GPU_SAMPLE_COLUMNS)
        self.cpu = frame(cpu, schema.CPU_SAMPLE_COLUMNS)
        self.batching = frame(batching, schema.BATCHING_FINDING_COLUMNS)
        self._workers = workers if callable(workers) else frame(workers, WORKER_COLUMNS)
        self.restarts = frame(restarts, RESTART_COLUMNS)
        self.fits = frame(fits, FIT_TIME_COLUMNS)
        self.loops = frame(loops, LOOP_COLUMNS)
        self.jobs = JobMerge() if jobs is None else jobs

    @property
    def steps(self) -> pd.DataFrame:
        """Every step with every column; built from the parts on first access, and
        from then on what the analysis reads (a user's edits count)."""
        if not isinstance(self._steps, pd.DataFrame):
            self._steps = self._steps.wide()
        return self._steps

    @steps.setter
    def steps(self, frame: pd.DataFrame) -> None:
        self._steps = frame

    @property
    def step_parts(self) -> StepParts:
        """The steps as the analysis reads them, without building the wide frame."""
        return step_parts(self._steps)

    @property
    def workers(self) -> pd.DataFrame:
        """The worker view; computed on first access where the loader gave a function."""
        if callable(self._workers):
            self._workers = self._workers()
        return self._workers

    @workers.setter
    def workers(self, frame: pd.DataFrame) -> None:
        self._workers = frame

    def frames(self, steps: bool = True) -> dict[str, pd.DataFrame]:
        """Every frame by name (``FRAME_NAMES``); ``steps=False`` leaves the steps out."""
        return {name: getattr(self, name) for name in FRAME_NAMES if steps or name != "steps"}

    def replace(self, **frames) -> RunFrames:
        """These frames with some replaced (the steps kept in parts where not given)."""
        current = {**self.frames(steps=False), "steps": self._steps, "jobs": self.jobs}
        return RunFrames(**{**current, **frames})

    def for_run(self, run: str) -> RunFrames:
        """The rows of one run id, and the facts about its job."""
        steps = self._steps
        if isinstance(steps, pd.DataFrame):
            steps = steps[steps["run"] == run].reset_index(drop=True)
        else:
            steps = steps.for_run(run)
        frames = {name: rows_of_run(frame, run) for name, frame in self.frames(False).items()}
        return RunFrames(steps=steps, jobs=self.jobs.for_run(run), **frames)


def rows_of_run(frame: pd.DataFrame, run: str) -> pd.DataFrame:
    """The rows of one run; the frame itself when it holds that run alone (no copy)."""
    mine = frame["run"] == run
    return (frame if mine.all() else frame[mine]).reset_index(drop=True)


def load_run_frames(
    files: Iterable[tuple[str | os.PathLike, int]],
    merge_runs: str | Sequence[Sequence[str]] | None = None,
    detected_need_cluster: bool = False,
) -> RunFrames:
    """The frames of records files: read, runs merged, frames built and joined.

    Args:
        files: ``(path, byte offset)`` pairs: each file is read from its offset (the
            first line of a run, ``Recorder.run_offset``).
        merge_runs: None, ``"detected"`` or groups of run ids to merge
            (``analysis.jobs.merge_jobs``).
        detected_need_cluster: with ``"detected"``, merge only the groups whose
            headers share a cluster fingerprint.

    Returns:
        A ``RunFrames``; its steps in parts and its worker view computed on first access.

    Raises:
        MergeRunsError: ``merge_runs`` names runs that cannot be merged.

    Example:

    ```python
    frames = load_run_frames([("runs/demo/keras_dp/worker-0.jsonl", 0)], merge_runs="detected")
    print(frames.runs)
    ```
    """
    records, jobs = merge_jobs(records_by_type(files), merge_runs, detected_need_cluster)
    gpu = of_type(records, "gpu_sample", schema.GPU_SAMPLE_COLUMNS)
    gpu = gpu.sort_values(["run", "worker", "time"])
    windows = windows_frame(records)
    starts = attempts(of_type(records, "header", ["run", "worker", "time", "pid", "hostname"]))
    runs = runs_frame(records)
    # Every step-wide pass below runs on the step records' dozen columns; the
    # breakdown's ~35 columns join last, on the rows that have one.
    steps, breakdown = timed_steps(records, runs)
    fits = fit_time_frame(records)
    records.pop("step", None)  # the step records: most of the memory, no longer read
    steps = with_gpu_utilization(mark_profiled(steps, windows), gpu)
    steps = assign_attempts(steps, starts)
    # One set of clock tables for the sync and the job's step times.
    clocks = clock_tables(steps)
    sync = cross_worker_sync_of(clocks)
    parts = with_breakdown(steps, breakdown, sync)
    parts = parts.with_all(with_job_step_ms(parts.all, clocks))
    del clocks, steps
    fit_ends = of_type(records, "fit_end", ["run", "worker", "time", "step", "status"])
    exits = of_type(records, "worker_exit", ["run", "worker", "time", "exit_code", "reason"])
    return RunFrames(
        runs=runs,
        steps=parts,
        replicas=replicas_frame(records),
        windows=windows,
        gpu=gpu.reset_index(drop=True),
        cpu=of_type(records, "cpu_sample", schema.CPU_SAMPLE_COLUMNS).reset_index(drop=True),
        batching=of_type(records, "batching_finding", schema.BATCHING_FINDING_COLUMNS).reset_index(
            drop=True
        ),
        # Its own view of the steps: later edits of .steps do not leak into it.
        workers=partial(worker_view, parts.all[_WORKER_VIEW_INPUT], starts, fit_ends, sync, exits),
        restarts=restarts(parts.all, starts),
        fits=fits,
        loops=of_type(records, "training_loop", LOOP_COLUMNS).reset_index(drop=True),
        jobs=jobs,
    )
