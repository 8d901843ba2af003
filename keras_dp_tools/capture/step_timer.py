"""StepTimer: host wall time and throughput of every training step."""

from __future__ import annotations

import atexit
import contextlib
import os
import time
import weakref

from keras_dp_tools.capture.base import DataParallelCallback
from keras_dp_tools.capture.profiler_windows import profiling_disturbs
from keras_dp_tools.capture.recorder import Recorder
from keras_dp_tools.capture.run_info import fit_last_batch, run_global_batch
from keras_dp_tools.capture.step_counter import StepCounter
from keras_dp_tools.common.validation import require_positive_int

SCALAR_BATCH = 64  # TensorBoard points handed to the recorder at once (and at epoch end)
# The step record's fields after type, run and worker (records.STEP_FIELDS plus time).
STEP_KEYS = ("time", "epoch", "step", "steps", "step_ms", "examples", "examples_per_s", "warmup")


class StepTimer(DataParallelCallback):
    """Records the wall time of each training step, and examples per second.

    Keras calls a batch hook once per call of the compiled train function, which
    runs up to ``steps_per_execution`` steps. The timer writes one ``step`` record per
    call (``steps`` says how many it covers, from ``optimizer.iterations``) with the
    call's time divided evenly. The batch-end hook runs once the step's logs have been
    fetched from the devices, so the time includes the whole step (input, compute,
    all-reduce, update). The first call of every ``fit`` includes tracing and
    compilation and is marked ``warmup``.

    ``examples`` counts what the call trained on: ``global_batch`` per step, less what
    a pass's smaller last batch lacks (``dataset.batch(64)`` over 1,000 examples: every
    16th step has 40), placed where fit's data allows it (arrays, and datasets where
    nothing after the batch op reorders batches); ``examples_per_s`` is that over the
    call's time. Where a smaller batch may come but cannot be placed, ``examples`` is
    None and ``examples_per_s`` counts full batches: behind ``batch().shuffle()``,
    ``take``, ``filter``, a parallel map or batch that is not deterministic
    (``deterministic=False``, or ``tf.data.Options().deterministic = False``),
    tf_keras's ``fit(shuffle="batch")``, a generator of unknown length,
    ``distribute_datasets_from_function``, or a ``global_batch`` used because fit's data
    does not say its batch. A multi-worker job counts a step's examples only where its
    workers' records agree (each reads its own dataset; see docs/records.md).

    It also records where the time between the steps goes: ``fit_begin``, each epoch's
    ``epoch_begin`` and ``epoch_end``, each validation inside ``fit``'s
    ``validation_begin`` and ``validation_end``, and ``fit_end``, on the step records'
    clock (``keras_dp_tools.analysis.fit_time`` splits a fit's wall time with them).
    These hooks run once per epoch or validation, never per step.

    Records go to ``<log_dir>/keras_dp/worker-<i>.jsonl``; TensorBoard scalars
    ``dp/step_ms`` and ``dp/examples_per_s`` to the run ``keras_dp/worker-<i>``, against
    the global step (batches; Keras's ``train`` run counts epochs). Warm-up calls and
    steps a ``DataParallelProfiler`` on the same log dir captures or slows down go to
    ``dp/step_ms_disturbed`` instead, so the headline tags show steady-state steps.
    Works for Keras 3 and tf_keras models, alone or next to ``keras.callbacks.TensorBoard``
    on the same ``log_dir``.

    Example:

    ```python
    import keras
    import numpy as np
    import tensorflow as tf
    import keras_dp_tools as kdt

    strategy = tf.distribute.MirroredStrategy()
    global_batch = kdt.scale_batch_size(32, strategy)
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
    x, y = np.zeros((256, 8)), np.zeros((256, 1))
    model.fit(x, y, batch_size=global_batch, epochs=1,
              callbacks=[kdt.StepTimer("logs/run1", global_batch=global_batch)])
    print(kdt.Report.load("logs/run1").steps[["step", "step_ms"]].head())
    ```

    Args:
        log_dir: run folder, the same one you may give ``keras.callbacks.TensorBoard``.
        global_batch: examples per step over all replicas, for ``examples_per_s``,
            used when fit's data does not say: by default the batch is read from
            ``fit`` (``batch_size`` for arrays, the ``tf.data.Dataset``'s batch,
            distributed datasets too) and the header's ``global_batch_source`` says
            where from. A value that disagrees with fit's batch is ignored, with a
            warning. When neither says, ``examples_per_s`` stays empty.
        tensorboard: also write TensorBoard scalars (default True).
    """

    def __init__(self, log_dir, global_batch: int | None = None, tensorboard: bool = True):
        super().__init__()
        self.log_dir = log_dir
        self.global_batch = (
            None if global_batch is None else require_positive_int("global_batch", global_batch)
        )
        self.tensorboard = tensorboard
        self._steps = StepCounter()
        self._epoch = 0
        self._call_started = None
        self._run_batch = None  # this fit's global batch (run_global_batch)
        # Where this fit's smaller batches fall (run_info.fit_last_batch), and the
        # global step the fit began at, which the passes count from.
        self._pass_batches: int | None = None
        self._last_batch: int | None = None
        self._fit_first_step = 0
        self._disturbed = False
        # TensorBoard points (step start, step, {tag: value}) not handed to the recorder
        # yet: handing them over in batches saves ~15 µs a step.
        self._points: list[tuple[float, int, dict[str, float | None]]] = []

    def on_train_begin(self, logs=None):
        self._end_fit("exited")  # a previous fit that raised never reached on_train_end
        # After that fit's end (the records keep time order), before our own set-up
        # (the fit's wall time includes it).
        began_at = time.time()
        # fit's own batch when it can be read, else the one we were given.
        self._run_batch = run_global_batch(self.global_batch)[0]
        self._recorder = Recorder.for_fit(self.log_dir, self.model, self._run_batch)
        self._steps.start(self.model)
        read_batch, self._pass_batches, self._last_batch = fit_last_batch()
        if read_batch != self._run_batch:  # a reading about other batches (global_batch=)
            self._pass_batches = self._last_batch = None
        self._fit_first_step = self._steps.next_step
        _open_fits.add(self)
        self._write_fit_event("fit_begin", began_at, epoch=None)  # initial_epoch comes next

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._write_fit_event("epoch_begin", time.time(), self._epoch)

    def on_test_begin(self, logs=None):
        # Also called by evaluate() outside fit: then no recorder is held, nothing is written.
        self._write_fit_event("validation_begin", time.time(), self._epoch)

    def on_test_end(self, logs=None):
        self._write_fit_event("validation_end", time.time(), self._epoch)

    def _write_fit_event(self, record_type: str, at: float, epoch: int | None) -> None:
        """Writes one of the records that time a fit's parts (``fit_begin``,
        ``epoch_begin``, ``epoch_end``, ``validation_begin``, ``validation_end``) while
        a fit is open: once per epoch or validation, never per step."""
        if self._recorder is not None:
            self._recorder.write(record_type, time=at, epoch=epoch, step=self._steps.next_step)

    def on_train_batch_begin(self, batch, logs=None):
        self._steps.begin_call(batch)
        started_at = time.time()  # the step record's time: the report's profiled rule
        self._disturbed = self.tensorboard and profiling_disturbs(self.log_dir, started_at)
        self._call_started = (started_at, time.perf_counter())

    def on_train_batch_end(self, batch, logs=None):
        if self._call_started is None:
            return
        started_at, started = self._call_started
        elapsed_s = time.perf_counter() - started
        warmup = self._steps.calls == 0
        step, steps = self._steps.end_call(batch)
        step_ms = 1000.0 * elapsed_s / steps
        examples = self._examples(step, steps)
        counted = examples if examples is not None else (self._run_batch or 0) * steps
        examples_per_s = counted / elapsed_s if counted and elapsed_s > 0 else None
        self._recorder.write_values(
            "step",
            STEP_KEYS,
            (started_at, self._epoch, step, steps, step_ms, examples, examples_per_s, warmup),
        )
        if self.tensorboard:
            if warmup or self._disturbed or profiling_disturbs(self.log_dir, started_at):
                values = {"dp/step_ms_disturbed": step_ms}
            else:
                values = {"dp/step_ms": step_ms, "dp/examples_per_s": examples_per_s}
            self._points.append((started_at, step, values))
            if len(self._points) >= SCALAR_BATCH:
                self._write_points()
        self._call_started = None

    def _examples(self, step: int, steps: int) -> int | None:
        """Examples the call of ``steps`` steps from global ``step`` trained on; None
        when the global batch is unknown or a smaller batch cannot be placed."""
        batch = self._run_batch
        if not batch or self._last_batch is None:
            return None
        if self._last_batch == 0:
            return batch * steps
        if not self._pass_batches:
            return None
        # Each pass's last step (position n-1, 2n-1, ... since the fit began) is smaller.
        first = step - self._fit_first_step
        smaller = (first + steps) // self._pass_batches - first // self._pass_batches
        return batch * steps - smaller * (batch - self._last_batch)

    def _write_points(self) -> None:
        points, self._points = self._points, []
        if points:
            self._recorder.scalar_points(points)

    def on_epoch_end(self, epoch, logs=None):
        ended_at = time.time()
        self._write_points()
        self._recorder.flush()
        self._write_fit_event("epoch_end", ended_at, epoch)

    def on_train_end(self, logs=None):
        self._end_fit("finished")

    def _end_fit(self, status: str) -> None:
        """Records how the fit ended: ``finished``, or ``exited`` when the process left
        it (an exception) without ``on_train_end``. A killed process records nothing,
        which is how a report tells the killed worker from the others."""
        _open_fits.discard(self)
        if self._recorder is not None:
            self._write_points()
            self._recorder.write(
                "fit_end", time=time.time(), step=self._steps.next_step, status=status
            )
        self._release_recorder()


_open_fits: weakref.WeakSet[StepTimer] = weakref.WeakSet()
# A forked child's exit must not end the parent's fits (a false "exited" record).
os.register_at_fork(after_in_child=_open_fits.clear)


@atexit.register
def _end_open_fits() -> None:
    for timer in list(_open_fits):
        # At exit, a failed record must not mask the error that ended the process.
        with contextlib.suppress(Exception):
            timer._end_fit("exited")
