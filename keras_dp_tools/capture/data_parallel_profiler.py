"""DataParallelProfiler: profiler windows and their per-step compute / all-reduce breakdown."""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import time
import weakref
from concurrent.futures import Future
from pathlib import Path

from keras_dp_tools.analysis.runner import WindowRunner
from keras_dp_tools.capture import profiler_windows
from keras_dp_tools.capture.base import DataParallelCallback, MeasurementWarning, find_in_fit
from keras_dp_tools.capture.monitor.background import NICE, lower_thread_priority
from keras_dp_tools.capture.recorder import Recorder
from keras_dp_tools.capture.run_info import (
    embedding_tables,
    gathered_bytes,
    gradient_bytes,
    keras_package,
    run_global_batch,
    steps_per_execution,
    strategy_devices,
    worker_index,
)
from keras_dp_tools.capture.step_counter import StepCounter
from keras_dp_tools.common.validation import require_positive_int
from keras_dp_tools.common.warn import warn
from keras_dp_tools.records.columns import WINDOW_SCALARS
from keras_dp_tools.records.contract import (
    PROFILE_RUN,
    PROFILE_SUBDIR,
    STEP_EVENT_NAME,
    TRACE_SUFFIX,
    step_marker_stats,
)
from keras_dp_tools.records.facts import RunFacts

logger = logging.getLogger("keras_dp_tools")

# Scalars written per analysed step, tag -> column (keras_dp_tools.records.columns).
SCALAR_TAGS = WINDOW_SCALARS


def profile_dir(log_dir, worker: int) -> Path:
    """Where a worker's captures go.

    Args:
        log_dir: the run folder given to the callbacks.
        worker: the worker's index in its job.

    Returns:
        ``<log_dir>/train`` for worker 0 (TensorBoard's Profile tab lists it as run
        ``train``), ``<log_dir>/train/worker-<i>`` for the others.

    Example:

    >>> from keras_dp_tools.capture.data_parallel_profiler import profile_dir
    >>> profile_dir("runs/exp1", 0).as_posix(), profile_dir("runs/exp1", 2).as_posix()
    ('runs/exp1/train', 'runs/exp1/train/worker-2')
    """
    base = Path(log_dir) / PROFILE_RUN
    return base if worker == 0 else base / f"worker-{worker}"


class DataParallelProfiler(DataParallelCallback):
    """Captures profiler windows and breaks each step down into compute and all-reduce.

    Every ``every`` steps from ``start_step`` on (once, if ``every`` is None), the
    TensorFlow profiler records ``window`` steps into ``<log_dir>/train``, where
    TensorBoard's Profile tab lists them. Each step is wrapped in
    ``tf.profiler.experimental.Trace("train", step_num=<global step>, _r=1)``, so XProf
    detects the steps (also in captures of your own, such as
    ``keras.callbacks.TensorBoard(profile_batch=...)``, which on its own reports "No step
    marker observed" with Keras 3).

    After a window, a background thread (a child process for traces of
    ``CHILD_PROCESS_MIN_BYTES`` or more) reads the trace and computes per step and
    replica: ``compute_ms``, ``allreduce_ms`` = ``sync_wait_ms`` (waiting for the slowest
    peer) + ``transfer_ms``, ``exposed_allreduce_ms`` (not hidden behind compute),
    ``input_ms``, ``other_ms`` (split into ``dispatch_ms``, ``idle_ms``,
    ``scheduling_ms``), ``comm_share``, ``wait_share``, the all-gathers of sparse
    gradients (``gather_ms``, ``gather_bytes``), and the bus bandwidths. Every time is
    per step, also under ``steps_per_execution`` (column ``steps``; see
    docs/breakdown.md). The results go to the records (``replica_step`` and
    ``step_breakdown``, read by ``kdt.Report``) and to TensorBoard scalars
    ``dp_window/compute_ms``, ``dp_window/allreduce_ms``, ``dp_window/comm_share``, ...
    (points only for profiled steps). The training thread only starts and
    stops the profiler; stopping it writes the trace, which takes a moment once per
    window.

    Only one profiler session can run in a process: a window that would overlap another
    session (a ``TensorBoard(profile_batch=...)`` in the same fit, or one you started)
    is skipped with a warning. The steps a ``TensorBoard(profile_batch=...)`` of the
    same fit profiles get a ``window`` record of status ``foreign``, so ``kdt.Report``
    marks them ``profiled`` and leaves them out of the step times.

    Example:

    ```python
    import keras
    import numpy as np
    import keras_dp_tools as kdt

    strategy = kdt.mirrored_strategy(2)  # 2 GPUs, or the CPU split in 2
    with strategy.scope():
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256),
                                  keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
    x, y = np.zeros((2048, 64)), np.zeros((2048, 1))
    model.fit(x, y, batch_size=64, epochs=1,
              callbacks=[kdt.DataParallelProfiler("logs/run1", start_step=5)])
    print(kdt.Report.load("logs/run1").steps.dropna(subset=["compute_ms"]))
    ```

    Args:
        log_dir: run folder, as for ``kdt.StepTimer`` and ``keras.callbacks.TensorBoard``.
        start_step: global step (``optimizer.iterations``) where the first window starts;
            the first call of every ``fit`` (tracing, compilation) is never profiled.
        window: steps (train-function calls) per window.
        every: steps from one window start to the next; None profiles one window.
        max_windows: most windows to capture over the callback's life (disk use).
        tensorboard: also write TensorBoard scalars.
        all_workers: under a multi-worker strategy, profile every worker. By default
            only worker 0 does: with TensorFlow 2.21, stopping the profiler on another
            worker crashed it (SIGABRT "free(): invalid pointer", SIGSEGV, SIGBUS) in 16
            of 155 two-worker runs here, whatever we tried, and lost trace events in
            about half of the others; a measurement must not kill training. The cause is in
            TensorFlow's profiler (a stale pointer when it merges activities that start
            and end on different threads, which only the other workers' collectives
            record); worker 0 never crashed. docs/multiworker.md has the details.
            With ``all_workers=True`` the other workers warn once.
    """

    def __init__(
        self,
        log_dir,
        start_step: int = 10,
        window: int = 5,
        every: int | None = None,
        max_windows: int = 20,
        tensorboard: bool = True,
        all_workers: bool = False,
    ):
        super().__init__()
        self.log_dir = log_dir
        if not isinstance(start_step, int) or start_step < 0:
            raise ValueError(f"start_step must be an integer >= 0, received {start_step!r}.")
        self.start_step = start_step
        self.window = require_positive_int("window", window)
        self.every = None if every is None else require_positive_int("every", every)
        if self.every is not None and self.every < self.window:
            raise ValueError(
                f"every={every} is shorter than window={window}: windows would overlap. "
                "Use every >= window, or every=None for a single window."
            )
        self.max_windows = require_positive_int("max_windows", max_windows)
        self.tensorboard = tensorboard
        self.all_workers = all_workers
        self.windows_taken = 0
        self._next_start = start_step
        self._steps = StepCounter()
        self._window = None  # the open window: dict of its record fields
        self._marker = None
        self._mark_steps = True
        self._foreign_calls: list[tuple[int, int]] = []  # calls other profilers claim
        self._foreign = None  # the record of the other profiler's range now running
        self._pending: list[tuple[dict, Future]] = []
        # Windows are analysed off the training thread, at a lower priority.
        self._runner = WindowRunner(lower_thread_priority, child_nice=NICE)
        self._warned: set[str] = set()
        self._run_facts = RunFacts()

    # -- hooks ---------------------------------------------------------------

    def on_train_begin(self, logs=None):
        self._close()
        strategy = self.model.distribute_strategy
        worker, workers = worker_index(strategy)
        self._recorder = Recorder.for_fit(self.log_dir, self.model)
        profiler_windows.register(self)
        reason = None
        if self._parameter_servers and self._next_start is not None:
            reason = "parameter-server training: no all-reduce to break down, no batch hooks"
        elif worker > 0 and not self.all_workers and self._next_start is not None:
            reason = (
                "only worker 0 profiles under a multi-worker strategy "
                "(DataParallelProfiler(all_workers=True) to change)"
            )
        if reason is not None:
            self._next_start = None  # no windows in this fit on this worker
            logger.info("DataParallelProfiler on worker %d of %d: %s", worker, workers, reason)
            self._recorder.write(
                "window",
                time=time.time(),
                start_step=self.start_step,
                status="skipped",
                reason=reason,
            )
        if worker > 0 and self.all_workers and self._next_start is not None:
            self._warn_once(
                "all_workers",
                f"DataParallelProfiler profiles worker {worker} (all_workers=True): with "
                "TensorFlow 2.21, stopping the profiler on a worker other than 0 can crash "
                "its process or lose trace events (a TensorFlow bug; see "
                "keras-dp docs multiworker). all_workers=False profiles worker 0 only.",
            )
        self._steps.start(self.model)
        # tf_keras marks every step itself; our markers nest inside its own in windows.
        self._mark_steps = keras_package(self.model) != "tf_keras"
        self._foreign_calls = _sibling_profile_calls(self)
        devices = strategy_devices(strategy)
        global_batch = run_global_batch()[0]
        self._run_facts = RunFacts(
            worker=worker,
            local_replicas=len(devices) or None,  # this worker's: the ones in its trace
            replicas_in_sync=int(strategy.num_replicas_in_sync),
            devices=devices,
            global_batch=global_batch,
            steps_per_execution=steps_per_execution(self.model),
            allreduce_bytes=gradient_bytes(self.model),
            **_sparse_facts(self.model, global_batch, int(strategy.num_replicas_in_sync)),
        )

    def on_train_batch_begin(self, batch, logs=None):
        step = self._steps.begin_call(batch)
        self._follow_foreign_begin(step)
        if self._window is None and self._window_due(step):
            self._open_window(step)
        if self._mark_steps or self._window is not None:
            import tensorflow as tf

            self._marker = tf.profiler.experimental.Trace(
                STEP_EVENT_NAME, step_num=step, _r=1, **step_marker_stats()
            )
            self._marker.__enter__()

    def on_train_batch_end(self, batch, logs=None):
        self._end_marker()
        first, steps = self._steps.end_call(batch)
        if self._window is not None:
            self._window["steps_covered"][first] = steps
        if self._foreign is not None and self._steps.calls > self._foreign["last_call"]:
            self._write_foreign()
        if self._window is not None and self._steps.calls >= self._window["end_call"]:
            self._close_window()
        self._collect(wait=False)

    def on_epoch_end(self, epoch, logs=None):
        self._collect(wait=False)

    def on_train_end(self, logs=None):
        self._close()

    def _on_failure(self):
        self._close()

    # -- windows -------------------------------------------------------------

    def _window_due(self, step: int) -> bool:
        if self._next_start is None or self.windows_taken >= self.max_windows:
            return False
        if step < self._next_start or self._steps.calls == 0:  # first call compiles
            return False
        call = self._steps.calls
        for first, last in self._foreign_calls:
            if call <= last and first < call + self.window:
                # Global steps, as start_step counts; TensorBoard counts calls from 1.
                per_call = steps_per_execution(self.model)
                first_step = step + (first - call) * per_call
                last_step = step + (last + 1 - call) * per_call - 1
                self._warn_once(
                    "foreign",
                    f"DataParallelProfiler moved its window past steps {first_step}-"
                    f"{last_step}, which keras.callbacks.TensorBoard(profile_batch="
                    f"({first + 1}, {last + 1})) profiles: only one profiler session can "
                    "run at a time. Report.steps marks those steps profiled.",
                )
                return False
        return True

    def _follow_foreign_begin(self, step: int) -> None:
        """At a call's start: note where a sibling TensorBoard's profiled range begins."""
        for first, last in self._foreign_calls:
            if self._steps.calls == first:
                self._foreign = {
                    "time": time.time(),
                    "start_step": step,
                    "last_call": last,
                    "reason": "profiled by keras.callbacks.TensorBoard(profile_batch="
                    f"({first + 1}, {last + 1})) in the same fit",
                }

    def _write_foreign(self) -> None:
        """The steps another profiler captured: Report marks them profiled."""
        foreign, self._foreign = self._foreign, None
        foreign.pop("last_call", None)
        self._recorder.write("window", **foreign, end_step=self._steps.next_step, status="foreign")

    def _schedule_next(self, step: int) -> None:
        self._next_start = None if self.every is None else max(step, self._next_start) + self.every

    def _open_window(self, step: int) -> None:
        import tensorflow as tf

        directory = profile_dir(self.log_dir, self._run_facts.worker)
        before = _captures(directory)
        try:
            self._start_profiler(directory)
        except (tf.errors.AlreadyExistsError, tf.errors.UnavailableError) as error:
            reason = f"another profiler session is active ({error.message})"
            self._schedule_next(step)
            self._recorder.write(
                "window", time=time.time(), start_step=step, status="skipped", reason=reason
            )
            self._warn_once(
                "busy",
                f"DataParallelProfiler skipped the window at step {step}: {reason}. Only one "
                "profiler session can run at a time; stop the other one or move start_step.",
            )
            return
        self._window = {
            "window": self.windows_taken,
            "start_step": step,
            "end_call": self._steps.calls + self.window,
            "directory": directory,
            "before": before,
            "started": time.time(),
            "steps_covered": {},  # first step of each call -> steps it ran
        }
        self.windows_taken += 1
        _open_windows.add(self)
        # A killed process never writes the capture: this record lets the report say so.
        self._recorder.write(
            "window",
            time=self._window["started"],
            window=self._window["window"],
            start_step=step,
            status="open",
        )
        logger.info("profiling %d steps from step %d into %s", self.window, step, directory)

    def _close_window(self) -> None:
        window, self._window = self._window, None
        _open_windows.discard(self)
        stop_started = time.perf_counter()
        _wait_for_a_free_capture_name(window["directory"])
        self._stop_profiler()
        stop_ms = 1000 * (time.perf_counter() - stop_started)
        first_step = window["start_step"]
        self._schedule_next(first_step)
        new = sorted(set(_captures(window["directory"])) - set(window["before"]))
        # The facts the window is analysed with, written with it (keras-dp analyze reads
        # them back to analyse the capture the same way).
        facts = dataclasses.replace(self._run_facts, steps_covered=window["steps_covered"])
        record = {
            "time": window["started"],
            "window": window["window"],
            "start_step": first_step,
            "end_step": self._steps.next_step,
            "stop_ms": stop_ms,
            **facts.to_record(),
        }
        if not new:
            self._write_window(record, "failed", "the profiler wrote no trace")
            return
        trace = new[-1]
        record["trace"] = str(_relative(trace, self.log_dir))
        record["profile_run"] = trace.parent.name

        def analysis_ended():
            # Until then the analysis competes with training for the CPU (at a lower
            # priority): steps up to here are marked as disturbed by profiling.
            record["analysis_end"] = time.time()

        self._pending.append((record, self._runner.submit(trace, facts, analysis_ended)))

    # The profiler session's start and stop, one place each (benchmarks/profiler_crash.py
    # tries variants of them through tests/jobs/train_job.py).
    def _start_profiler(self, directory: Path) -> None:
        import tensorflow as tf

        tf.profiler.experimental.start(str(directory))

    def _stop_profiler(self) -> None:
        import tensorflow as tf

        tf.profiler.experimental.stop()

    def _collect(self, wait: bool) -> None:
        """Writes the results of finished analyses (all of them if ``wait``)."""
        if not self._pending:
            return
        if wait:
            logger.info("keras_dp_tools: analysing %d profiler window(s)", len(self._pending))
        still_running = []
        for record, future in self._pending:
            if not wait and not future.done():
                still_running.append((record, future))
                continue
            try:
                breakdown = future.result()
            except Exception as error:  # a bad trace costs its window, not the callback
                self._write_window(record, "failed", f"{type(error).__name__}: {error}")
                message = f"DataParallelProfiler could not analyse {record['trace']}: {error}"
                self._warn_once("analysis", message)
                continue
            self._write_breakdown(record, breakdown)
        self._pending = still_running

    def _write_breakdown(self, record: dict, breakdown) -> None:
        window = record["window"]
        for row in breakdown.replicas.to_dict("records"):
            self._recorder.write("replica_step", time=record["time"], window=window, **row)
        steps = breakdown.steps.to_dict("records")
        for row in steps:
            self._recorder.write("step_breakdown", time=record["time"], window=window, **row)
            if self.tensorboard:
                values = {tag: _number(row.get(name)) for tag, name in SCALAR_TAGS.items()}
                self._recorder.scalars(int(row["step"]), values)
        # A step whose marker cannot be true has a row with empty numbers: the window's
        # reason says which and why (breakdown.unmeasured).
        measured = sum(row["step_ms"] == row["step_ms"] for row in steps)  # NaN: not measured
        if measured:
            status, reason = "analysed", breakdown.unmeasured
        else:
            status, reason = "failed", breakdown.unmeasured or "no step markers in trace"
        record["attribution"] = breakdown.attribution
        self._write_window(record, status, reason, steps=measured)

    def _write_window(self, record: dict, status: str, reason: str | None, steps=0) -> None:
        self._recorder.write("window", **record, status=status, reason=reason, steps_analysed=steps)

    # -- cleanup ---------------------------------------------------------------

    def _end_marker(self) -> None:
        marker, self._marker = self._marker, None
        if marker is not None:
            marker.__exit__(None, None, None)

    def _close(self) -> None:
        self._end_marker()
        if self._foreign is not None and self._recorder is not None:  # fit ended inside it
            self._write_foreign()
        self._foreign = None
        if self._window is not None:  # training ended or failed inside a window
            self._window["end_call"] = self._steps.calls
            try:
                self._close_window()
            except Exception as error:
                logger.debug("stopping the profiler failed: %s", error)
                self._window = None
        if self._recorder is not None:
            try:
                self._collect(wait=True)
            finally:
                self._release_recorder()
        self._runner.shutdown()
        self._pending = []

    @property
    def busy(self) -> bool:
        """Whether a window is captured or an analysis is pending (else the profiler
        disturbs no step)."""
        return self._window is not None or bool(self._pending)

    def disturbing(self, started: float) -> bool:
        """Whether a step that started at ``started`` (``time.time()``) is slowed by this
        profiler: a window is captured, or an analysis had not ended by then. The
        report's rule for profiled steps (``analysis_end``), so both agree even when an
        analysis ends between the two reads."""
        if self._window is not None:
            return True
        ends = [record.get("analysis_end") for record, _ in self._pending]
        return any(end is None or end >= started for end in ends)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warn(message, MeasurementWarning)


# Profilers inside a window: a fit that raised never calls on_train_end, so the window
# is closed (its trace written and analysed) by the next fit or at exit.
_open_windows: weakref.WeakSet[DataParallelProfiler] = weakref.WeakSet()
# A forked child's exit must not stop and analyse the parent's window.
os.register_at_fork(after_in_child=_open_windows.clear)


@atexit.register
def _close_open_windows() -> None:
    for profiler in list(_open_windows):
        try:
            profiler._close()
        except Exception as error:  # at exit, TensorFlow may be half torn down
            logger.debug("closing a profiler window at exit failed: %s", error)


def _sparse_facts(model, global_batch: int | None, replicas: int) -> dict:
    """Embedding tables' bytes (their gradients are all-gathered, not all-reduced) and
    the bytes one step gathers, for the breakdown's byte and bandwidth columns."""
    tables = embedding_tables(model)
    return {
        "sparse_bytes": sum(table["table_bytes"] for table in tables) or None,
        "gather_bytes": gathered_bytes(tables, global_batch, replicas),
    }


def _wait_for_a_free_capture_name(directory: Path) -> None:
    """The profiler names a capture by the local second it stops in and overwrites a
    capture of the same name: wait out the second of an earlier capture (ours, or a
    TensorBoard callback's) rather than replace it. Rare, and under a second."""
    taken = {path.name for path in (directory / PROFILE_SUBDIR).glob("*")}
    while time.strftime("%Y_%m_%d_%H_%M_%S") in taken:
        time.sleep(0.02)


def _captures(directory: Path) -> list[Path]:
    return sorted((directory / PROFILE_SUBDIR).glob(f"*/*{TRACE_SUFFIX}"))


def _relative(path: Path, log_dir) -> Path:
    try:
        return path.resolve().relative_to(Path(log_dir).resolve())
    except ValueError:
        return path


def _number(value):
    try:
        return None if value is None or value != value else float(value)
    except (TypeError, ValueError):
        return None


def _sibling_profile_calls(callback) -> list[tuple[int, int]]:
    """Calls of this fit (0-based) that another callback of the same fit will profile.

    Reads the ``profile_batch`` range (``_start_batch`` / ``_stop_batch``, counted
    from 1) of TensorBoard callbacks in the ``CallbackList`` that is calling us. If
    that fails, starting the profiler still detects the collision.
    """

    def profiled_calls(frame_locals):
        members = getattr(frame_locals.get("self"), "callbacks", None)
        if not isinstance(members, list) or not any(member is callback for member in members):
            return None
        return [
            (int(member._start_batch) - 1, int(member._stop_batch) - 1)
            for member in members
            if member is not callback and getattr(member, "_start_batch", 0)
        ]

    return find_in_fit(profiled_calls) or []
