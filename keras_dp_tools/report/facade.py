"""Report: the records of one or many runs as pandas DataFrames.

A facade over one ``RunFrames`` (``keras_dp_tools.analysis.run_frames``, built by its
``load_run_frames``): each method is one line into an analyzer that takes the frames
(``summary``, ``run_advice``, ``job_advice``, ``utilization``) or a presenter
(``report.text``, ``report.export``). Needs no TensorFlow, so it works in a notebook on
a machine that never trained anything.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd

from keras_dp_tools.analysis import summary as run_summaries
from keras_dp_tools.analysis import utilization
from keras_dp_tools.analysis.attempts import RESTART_COLUMNS
from keras_dp_tools.analysis.frame_columns import (
    BREAKDOWN_COLUMNS,
    MONITOR_COLUMNS,
    PLAN_COLUMNS,
    REPLICA_FRAME_COLUMNS,
    RUN_COLUMNS,
    TIMED_STEP_COLUMNS,
    WINDOW_COLUMNS,
)
from keras_dp_tools.analysis.job_advice import job_findings, records_findings
from keras_dp_tools.analysis.run_advice import advise_run
from keras_dp_tools.analysis.run_frames import RunFrames, load_run_frames
from keras_dp_tools.analysis.step_parts import StepParts
from keras_dp_tools.analysis.workers import WORKER_COLUMNS, WORKER_STEP_COLUMNS
from keras_dp_tools.common.findings import Finding
from keras_dp_tools.records.columns import (
    BATCHING_FINDING_COLUMNS,
    CPU_SAMPLE_COLUMNS,
    GPU_SAMPLE_COLUMNS,
    GPU_STATUS_COLUMNS,
)
from keras_dp_tools.records.reader import find_record_files
from keras_dp_tools.report.export import write_frames
from keras_dp_tools.report.text import report_text

# The frames' columns, each list named after the frame it describes (Report's Attributes).
__all__ = [
    "BATCHING_FINDING_COLUMNS",
    "BREAKDOWN_COLUMNS",
    "CPU_SAMPLE_COLUMNS",
    "GPU_SAMPLE_COLUMNS",
    "GPU_STATUS_COLUMNS",
    "MONITOR_COLUMNS",
    "PLAN_COLUMNS",
    "REPLICA_FRAME_COLUMNS",
    "RESTART_COLUMNS",
    "RUN_COLUMNS",
    "TIMED_STEP_COLUMNS",
    "WINDOW_COLUMNS",
    "WORKER_COLUMNS",
    "WORKER_STEP_COLUMNS",
    "Report",
]


class _FrameOf:
    """A ``Report`` attribute that is the frame of the same name of its ``RunFrames``."""

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, report, owner=None):
        return self if report is None else getattr(report.frames, self.name)

    def __set__(self, report, frame: pd.DataFrame) -> None:
        setattr(report.frames, self.name, frame)


class Report:
    """Records of one or more runs, loaded with ``Report.load``.

    Attributes:
        runs: one row per run and worker (``RUN_COLUMNS``), from the run headers
            (strategy, replicas, devices, global batch, versions, host, start
            ``time`` in Unix seconds).
        steps: one row per worker and recorded train-function call
            (``TIMED_STEP_COLUMNS``, then the breakdown's); ``step`` is the
            global step (``optimizer.iterations``) it started at and ``steps`` how
            many steps it covers (more than 1 with ``steps_per_execution``);
            ``step_ms`` is wall time per step. ``warmup`` rows include tracing and
            compilation. ``profiled`` rows ran while a profiler window was captured or
            analysed, which slows steps: the summary's step times leave them out.
            Steps inside a profiler window also carry the breakdown
            (``BREAKDOWN_COLUMNS``: compute, all-reduce, sync wait, shares, averaged
            over replicas); other steps leave those columns empty. With GpuMonitor,
            ``gpu_util_mean`` is the GPUs' mean utilization over the step.
        replicas: one row per profiled step and replica (``REPLICA_FRAME_COLUMNS``):
            the breakdown of each replica, for finding stragglers.
        windows: one row per profiler window: its steps, ``status`` (``analysed``,
            ``skipped``, ``failed`` with a ``reason``), and the capture's name in
            TensorBoard's Profile tab (``profile_run``) and file (``trace``).
        gpu: GpuMonitor's readings (``GPU_SAMPLE_COLUMNS``), one row per GPU and
            reading; ``sampling`` is ``poll`` (every field) or ``buffer`` (the driver's
            utilization buffer). ``runs.gpu_available`` / ``gpu_reason`` say why it
            is empty.
        cpu: host CPU usage readings (``CPU_SAMPLE_COLUMNS``; 100% = one core).
        batching: findings of the batching check before the first step (severity,
            code, message, fix), from ``BatchScalingCheck``.
        workers: one row per run, worker and attempt (``WORKER_COLUMNS``): steps
            recorded, how its fit ended (``finished``, ``exited``, or empty: killed
            or still running), clock offset and alignment residual, median wait for
            other workers, and how often it entered a step last (the straggler view).
        restarts: one row per restart of a worker under the same run id
            (``RESTART_COLUMNS``; e.g. after ``BackupAndRestore``): where it resumed
            and how many steps it ran again.
        fits: one row per run, worker and ``fit`` call: where its wall time went, in
            the steps or outside them (validation, epoch set-up, between steps, the
            first step's tracing; ``keras_dp_tools.analysis.fit_time``).
        loops: one row per ``training_loop`` record of ``kdt.TrainingLoop``: how a
            custom loop's steps called ``strategy.run`` (``step_function``: ``tf.function``
            or ``eager``, ``eager_steps``; the latest row of a run and worker counts).
        jobs: findings about the log dir's jobs (``keras_dp_tools.analysis.job_advice``):
            runs that look like one job's workers recorded under separate ids (see
            ``load``'s ``merge_runs``), runs merged, workers missing or from another
            job. ``job_findings()`` adds the workers' clocks; ``advice()`` and
            ``text()`` include them all.
        log_dirs: the folders ``load`` was given (``write_html`` shows the strategy
            comparisons recorded under them).

    Example:

    ```python
    import keras_dp_tools as kdt

    report = kdt.Report.load("runs/demo-20261129-093000")
    print(report.summary())
    report.steps.plot(x="step", y="step_ms")
    ```
    """

    def __init__(self, runs: pd.DataFrame, steps: pd.DataFrame, **frames):
        # The other frames by name, as RunFrames takes them (replicas, windows, gpu,
        # cpu, batching, workers, restarts); a frame not given is empty.
        self.frames = RunFrames(runs, steps, **frames)
        # The folders load searched: where the HTML report looks for strategy comparisons.
        self.log_dirs: list[Path] = []

    @classmethod
    def of_frames(cls, frames: RunFrames) -> Report:
        """A Report of a run's frames (``keras_dp_tools.analysis.run_frames``)."""
        report = cls.__new__(cls)
        report.frames, report.log_dirs = frames, []
        return report

    # Each frame is the RunFrames' own: reading and setting it read and set that.
    runs = _FrameOf()
    steps = _FrameOf()  # the wide frame, built from the parts on first access
    replicas = _FrameOf()
    windows = _FrameOf()
    gpu = _FrameOf()
    cpu = _FrameOf()
    batching = _FrameOf()
    workers = _FrameOf()  # computed on first access (a median per attempt over every step)
    restarts = _FrameOf()
    fits = _FrameOf()
    loops = _FrameOf()

    @property
    def step_parts(self) -> StepParts:
        """The steps as the analysis reads them (``keras_dp_tools.analysis.step_parts.
        StepParts``): every step's own columns, and the rows with a breakdown, without
        building the wide ``steps``."""
        return self.frames.step_parts

    @property
    def jobs(self) -> list[Finding]:
        """The findings of the log dir's records about its jobs (see the class's
        Attributes; ``keras_dp_tools.analysis.job_advice.records_findings``)."""
        return records_findings(self.frames.jobs)

    def __repr__(self) -> str:
        return (
            f"Report(runs={self.runs['run'].nunique()}, workers={len(self.runs)}, "
            f"step_records={len(self.step_parts.all)})"
        )

    @classmethod
    def load(
        cls,
        sources: str | os.PathLike | Iterable[str | os.PathLike],
        merge_runs: str | Sequence[Sequence[str]] | None = None,
        trials: bool = False,
    ) -> Report:
        """Loads every records file under one or more log dirs (searched recursively)
        or ``.jsonl`` paths, merging runs and workers.

        Example:

        ```python
        report = kdt.Report.load("runs/job", merge_runs="detected")
        print(report.text())
        ```

        Args:
            sources: log dirs or records files.
            merge_runs: workers of one job recorded under separate run ids (records
                written before the workers agreed on one, or where they could not)
                load as separate runs, and ``jobs``/``text()`` say so. ``"detected"``
                merges the runs that look like one job's workers
                (``keras_dp_tools.analysis.jobs.split_runs``: same cluster, disjoint
                workers, overlapping times); groups of run ids, e.g.
                ``[["run-a", "run-b"]]``, merge those. A merged run keeps the id of
                its lowest worker's run.
            trials: also the candidates' short runs kept below a strategy comparison
                (``compare_strategies``'s log dir): left out by default, as they are the
                comparison's evidence, not your training.

        Raises:
            FileNotFoundError: a path does not exist, or holds no records.
            ValueError: ``merge_runs`` is none of the above, names unknown runs or
                a run twice, or runs that share a worker index.
        """
        given = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
        files = ((path, 0) for path in find_record_files(given, trials=trials))
        report = cls.from_files(files, merge_runs=merge_runs)
        report.log_dirs = [Path(source) for source in given if Path(source).is_dir()]
        return report

    @classmethod
    def from_files(
        cls,
        files: Iterable[tuple[str | os.PathLike, int]],
        merge_runs: str | Sequence[Sequence[str]] | None = None,
    ) -> Report:
        """A Report of the given records files, each read from a byte offset (the first
        line of a run, ``Recorder.run_offset``: ``RunAdvisor`` reads its run's records
        without the runs before it); ``merge_runs`` as in ``load``."""
        return cls.of_frames(load_run_frames(files, merge_runs))

    def gpu_by_epoch(self) -> pd.DataFrame:
        """Per run, worker, epoch and GPU: mean utilization over the epoch's steps, mean
        SM activity and power, peak memory (``keras_dp_tools.analysis.utilization``)."""
        return utilization.epoch_gpu_summary(self.gpu, self.steps)

    def gpu_findings(self) -> list[str]:
        """Notes where NVML utilization is possibly misleading (SM activity much lower):
        the evidence of the ``misleading-utilization`` findings of ``advice()``."""
        return utilization.utilization_findings(self.gpu)

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
        return run_summaries.run_summary(self.frames, advice=advice)

    def text(self) -> str:
        """The labelled summary (a line per field: label, the value of each run, unit,
        ``summary()`` column; shares in %) and how to read it, the scaling table when
        the runs differ in replicas, and the advice, as plain text for terminals and
        logs."""
        return report_text(self.frames)

    def for_run(self, run: str) -> Report:
        """The part of this report that belongs to one run id (and its job's findings)."""
        return Report.of_frames(self.frames.for_run(run))

    def compare(self) -> pd.DataFrame:
        """Runs side by side by replica count: throughput, speed-up and scaling efficiency.

        ``speedup`` is throughput over that of the run with the fewest replicas (1, in a
        sweep from 1), and ``scaling_efficiency`` is ``throughput_N / (N / N0 ×
        throughput_N0)``: 1.0 is perfect linear scaling. With several runs at one replica
        count, the latest counts. Throughput is examples/s where the global batch is
        known, else steps/s.
        """
        return run_summaries.scaling_table(self.summary(advice=False))

    def advice(self) -> list[Finding]:
        """Findings with their evidence and a concrete fix, worst first
        (``keras_dp_tools.analysis.run_advice.advise_run``: the advisor's, and the jobs'
        of ``job_findings()``; each a ``kdt.Finding``)."""
        return advise_run(self.frames)

    def job_findings(self) -> list[Finding]:
        """What does not fit in the log dir's jobs: runs that look split or were
        merged, workers missing or from another job, clocks far apart
        (``keras_dp_tools.analysis.job_advice``)."""
        return job_findings(self.frames)

    def to_csv(self, directory: str | os.PathLike) -> list[Path]:
        """Writes every frame (and the summary) as ``<directory>/<name>.csv``."""
        return write_frames(self._export_frames(), directory, "csv")

    def to_parquet(self, directory: str | os.PathLike) -> list[Path]:
        """Writes every frame (and the summary) as ``<directory>/<name>.parquet``;
        needs a parquet engine (pyarrow, installed with keras_dp_tools)."""
        return write_frames(self._export_frames(), directory, "parquet")

    def _export_frames(self) -> dict[str, pd.DataFrame]:
        return {**self.frames.frames(), "summary": self.summary(advice=False).reset_index()}
