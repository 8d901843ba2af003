"""TrainingLoop: measures a custom training loop (``strategy.run`` in a ``tf.function``)
as ``kdt.callbacks`` measures ``model.fit``.

A custom loop calls no callbacks. Keras's documented way to use callbacks in one is a
``keras.callbacks.CallbackList`` whose ``on_train_begin``, ``on_epoch_begin``,
``on_train_batch_begin/end``, ... the loop calls itself; ``TrainingLoop`` does that
with our callbacks (``kdt.callbacks(log_dir)`` by default), so the same records and
profiler windows (with their step markers) are written and ``kdt.Report``, the advice,
the dashboard and ``keras-dp analyze`` read a custom loop as they read ``fit``.

It also notes how each step ran ``strategy.run``: called eagerly (outside any
``tf.function``), MirroredStrategy runs the replicas one after another, so more
devices do not make a step faster. The ``training_loop`` record says so and
``analysis.loop_advice`` turns it into an error-severity finding.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time

from keras_dp_tools.capture.base import MeasurementWarning, keras_package
from keras_dp_tools.capture.recorder import Recorder
from keras_dp_tools.capture.step_counter import StepCounter
from keras_dp_tools.common.validation import require_positive_int
from keras_dp_tools.common.warn import warn_without_raising

logger = logging.getLogger("keras_dp_tools")

RECORD_TYPE = "training_loop"
# How the steps ran strategy.run (the record's ``step_function``).
IN_FUNCTION = "tf.function"
EAGER = "eager"  # strategy.run called outside any tf.function
FUNCTIONS_RUN_EAGERLY = "run_functions_eagerly"  # tf.config.run_functions_eagerly(True)
UNSEEN = "unknown"  # no strategy.run call seen (another strategy object, or none)


class TrainingLoop:
    """Records a custom training loop's steps, profiler windows and advice, as for ``fit``.

    Use it as a context manager around the loop (``on_train_begin`` / ``on_train_end``
    of the callbacks), and ``with loop.step():`` around each call of the distributed
    step function (``on_train_batch_begin`` / ``on_train_batch_end``); ``with
    loop.epoch(epoch):`` around an epoch is optional. The callbacks are called through
    Keras's ``CallbackList`` (Keras 3's, or tf_keras's for a tf_keras model), so any
    Keras callback can be added. At the end of each step the loop waits for the devices
    (``tf.test.experimental.sync_devices``), so a step's time is the whole step's, as
    ``fit``'s batch-end hook sees it.

    While the loop runs, ``strategy.run`` is followed (an attribute of the strategy
    object, removed at the end): a step that calls it outside any ``tf.function`` is
    recorded as eager. MirroredStrategy then runs the replicas one after another, so
    the advice reports an error with the fix: wrap the distributed step in
    ``tf.function``.

    A measurement that fails warns once (``MeasurementWarning``) and the loop trains
    on without it; errors of your own step function are yours and propagate.

    Example:

    ```python
    import keras
    import tensorflow as tf
    import keras_dp_tools as kdt

    strategy = kdt.mirrored_strategy(2)  # 2 GPUs, or the CPU split in 2
    global_batch = 64
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(0.01)
    features = tf.random.normal((global_batch * 20, 8))
    dataset = tf.data.Dataset.from_tensor_slices((features, features[:, :1])).batch(global_batch)
    batches = strategy.experimental_distribute_dataset(dataset)

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            per_example = keras.losses.mean_squared_error(y, model(x, training=True))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        return loss

    @tf.function  # without it, the replicas run one after another
    def train_step(x, y):
        losses = strategy.run(replica_step, args=(x, y))
        return strategy.reduce("SUM", losses, axis=None)

    with kdt.TrainingLoop("logs/loop", strategy, model, global_batch=global_batch,
                          profile_start_step=5) as loop:
        for x, y in batches:
            with loop.step():
                train_step(x, y)
    print(kdt.Report.load("logs/loop").summary().T)
    ```

    Args:
        log_dir: the run folder, as for ``kdt.callbacks``.
        strategy: the ``tf.distribute`` strategy the loop calls ``run`` on.
        model: the model being trained, built under ``strategy.scope()`` (Keras 3 or
            tf_keras): the run header, the profiler's gradient bytes and the step count
            (``model.optimizer.iterations`` when the model has an optimizer, else from
            0) are read off it.
        global_batch: examples per step over all replicas, for throughput (a custom
            loop's data is not read: without it ``examples_per_s`` stays empty).
        callbacks: the callbacks to call (ours or any Keras callback of the model's
            Keras); by default ``kdt.callbacks(log_dir, global_batch=global_batch,
            **options)``.
        **options: passed to ``kdt.callbacks`` when ``callbacks`` is None
            (``profile_start_step``, ``profile_every``, ``monitor``, ``tensorboard``,
            ...).

    Raises:
        ValueError: ``global_batch`` is not a positive integer, or ``options`` come
            with ``callbacks``.
    """

    def __init__(self, log_dir, strategy, model, *, global_batch=None, callbacks=None, **options):
        self.log_dir = log_dir
        self.strategy = strategy
        self.model = model
        self.global_batch = (
            None if global_batch is None else require_positive_int("global_batch", global_batch)
        )
        if callbacks is not None and options:
            raise ValueError(
                f"options {sorted(options)} are for kdt.callbacks, but callbacks= was given "
                "too: configure those callbacks yourself, or drop callbacks=."
            )
        if callbacks is None:
            from keras_dp_tools.capture import callbacks as recommended

            callbacks = recommended(log_dir, global_batch=self.global_batch, **options)
        self.callbacks = list(callbacks)
        self._hooks = None  # the CallbackList while the loop runs
        self._recorder = None
        self._watch = RunWatch()
        self._steps = StepCounter()
        self._epoch = None  # the open epoch
        self._next_epoch = 0
        self._batch = 0  # steps begun in the open epoch
        self._step_open = False
        self._running = False
        self._gpus = False  # whether steps end by waiting for the GPUs
        self._warned: set[str] = set()
        # What the training_loop record says (see docs/records.md).
        self._first_step = None
        self._steps_run = 0
        self._eager_steps = 0
        self._first_eager_step = None
        self._unseen_steps = 0
        self._run_functions_eagerly = False

    # -- the loop ------------------------------------------------------------

    def __enter__(self) -> TrainingLoop:
        self.begin()
        return self

    def __exit__(self, kind, error, traceback) -> None:
        # As fit: a loop that raised calls no on_train_end (the callbacks record that
        # the run exited), but the strategy is given back its own run.
        self.end(finished=kind is None)

    def begin(self) -> None:
        """Starts the run: ``on_train_begin`` of the callbacks (``with loop:`` calls it)."""
        if self._running:
            return
        self._running = True
        self._steps_run = self._eager_steps = self._unseen_steps = 0
        self._first_step = self._first_eager_step = None
        # In the scope: the model.distribute_strategy of an uncompiled model.
        with self._measuring("begin"), self.strategy.scope():
            self._steps.start(self.model)  # the callbacks' numbering: the same source
            self._hooks = _callback_list(self.callbacks, self.model)
            self._hooks.on_train_begin()
        # Apart: without its own record the loop still calls the callbacks.
        with self._measuring("the training_loop record"), self.strategy.scope():
            self._recorder = Recorder.for_fit(self.log_dir, self.model, self.global_batch)
        with self._measuring("follow strategy.run"):
            self._watch.install(self.strategy)
        with self._measuring("waiting for the devices"):
            import tensorflow as tf

            # CPU ops and functions end before their call returns; GPU kernels do not.
            self._gpus = bool(tf.config.list_logical_devices("GPU"))

    def end(self, finished: bool = True) -> None:
        """Ends the run: closes an open epoch, writes the ``training_loop`` record and
        calls ``on_train_end`` (``with loop:`` calls it; ``finished=False`` after an
        error, which like ``fit`` skips ``on_train_end``)."""
        if not self._running:
            return
        self._running = False
        with self._measuring("follow strategy.run"):
            self._watch.remove()
        if finished:
            self._end_epoch()
        with self._measuring("the training_loop record"):
            self._write_record("finished" if finished else "exited")
        if finished and self._hooks is not None:
            with self._measuring("end"), self.strategy.scope():
                self._hooks.on_train_end()
        recorder, self._recorder = self._recorder, None
        if recorder is not None:
            with self._measuring("the training_loop record"):
                recorder.release()
        self._hooks = None

    @contextlib.contextmanager
    def epoch(self, epoch: int | None = None):
        """Context of one epoch: ``on_epoch_begin`` / ``on_epoch_end``. Optional: steps
        outside an epoch context count as epoch 0 (or the one after the last)."""
        self._end_epoch()
        self._begin_epoch(self._next_epoch if epoch is None else int(epoch))
        yield self
        self._end_epoch()

    @contextlib.contextmanager
    def step(self, steps: int = 1):
        """Context of one call of the distributed step function, which runs ``steps``
        optimizer steps (a loop of several steps inside one ``tf.function``, as
        ``steps_per_execution``). At its end the devices are waited for, so the step's
        time includes all its work.

        Args:
            steps: optimizer steps the call runs.

        Raises:
            ValueError: ``steps`` is not a positive integer.
        """
        steps = require_positive_int("steps", steps)
        if not self._begin_step():
            yield self
            return
        try:
            yield self
        except BaseException:
            self._step_open = False  # as fit: a step that raised ends no batch
            self._watch.end_step()
            raise
        self._end_step(steps)

    def wrap(self, step_function):
        """``step_function`` with each call measured as one step (``with loop.step()``).

        Example: ``train_step = loop.wrap(train_step)``.
        """

        @functools.wraps(step_function)
        def measured_step(*args, **kwargs):
            with self.step():
                return step_function(*args, **kwargs)

        return measured_step

    # -- steps and epochs ------------------------------------------------------

    def _begin_epoch(self, epoch: int) -> None:
        self._epoch, self._next_epoch, self._batch = epoch, epoch + 1, 0
        if self._hooks is not None:
            with self._measuring("on_epoch_begin"):
                self._hooks.on_epoch_begin(epoch)

    def _end_epoch(self) -> None:
        epoch, self._epoch = self._epoch, None
        if epoch is not None and self._hooks is not None:
            with self._measuring("on_epoch_end"):
                self._hooks.on_epoch_end(epoch)

    def _begin_step(self) -> bool:
        """Whether this step is measured; calls the batch-begin hooks if it is."""
        import tensorflow as tf

        if tf.inside_function():
            self._warn_once(
                "traced",
                "TrainingLoop.step() was called inside a tf.function, where it runs once "
                "when the function is traced, not every step: call it around the call of "
                "the tf.function, in the Python loop.",
            )
            return False
        if not self._running or self._step_open:
            if not self._running:
                self._warn_once(
                    "not running",
                    "TrainingLoop.step() was called outside `with TrainingLoop(...)` (or "
                    "before begin()): the step is not measured.",
                )
            return False
        if self._epoch is None:
            self._begin_epoch(self._next_epoch)
        self._step_open = True
        self._watch.start_step()
        self._steps.begin_call(self._batch)
        if self._hooks is not None:
            with self._measuring("on_train_batch_begin"):
                self._hooks.on_train_batch_begin(self._batch)
        return True

    def _end_step(self, steps: int) -> None:
        self._step_open = False
        if self._gpus:
            with self._measuring("waiting for the devices"):
                _sync_devices()
        last = self._batch + steps - 1
        mode, functions_eagerly = self._watch.end_step()
        step = self._steps.end_call(last)[0]
        if self._hooks is not None:
            with self._measuring("on_train_batch_end"):
                self._hooks.on_train_batch_end(last)
        self._batch = last + 1
        self._count(step, mode, functions_eagerly, steps)

    def _count(self, step: int, mode: str, functions_eagerly: bool, steps: int) -> None:
        if self._first_step is None:
            self._first_step = step
        self._steps_run += steps
        if mode in (EAGER, FUNCTIONS_RUN_EAGERLY):
            self._eager_steps += steps
            self._run_functions_eagerly |= functions_eagerly
            if self._first_eager_step is None:
                self._first_eager_step = step
        elif mode == UNSEEN:
            self._unseen_steps += steps
        if self._steps_run == steps:  # the first step: what is known now, if it dies
            with self._measuring("the training_loop record"):
                self._write_record("running")

    # -- the record ------------------------------------------------------------

    def step_function(self) -> str:
        """How the loop's steps ran ``strategy.run`` so far: ``"eager"`` when some
        step called it outside any ``tf.function``, ``"run_functions_eagerly"`` when
        that came from ``tf.config.run_functions_eagerly(True)``, ``"tf.function"``
        when every step's call was inside one (traced, or not called again), and
        ``"unknown"`` before a step or when no step called ``strategy.run``."""
        if self._eager_steps:
            return FUNCTIONS_RUN_EAGERLY if self._run_functions_eagerly else EAGER
        if self._steps_run and self._watch.traced_calls:
            return IN_FUNCTION
        return UNSEEN

    def _write_record(self, status: str) -> None:
        if self._recorder is None:
            return
        self._recorder.write(
            RECORD_TYPE,
            time=time.time(),
            status=status,
            step_function=self.step_function(),
            step=self._first_step,
            steps=self._steps_run,
            eager_steps=self._eager_steps,
            first_eager_step=self._first_eager_step,
            traced_run_calls=self._watch.traced_calls,
            replicas=int(getattr(self.strategy, "num_replicas_in_sync", 1) or 1),
        )

    # -- failures --------------------------------------------------------------

    @contextlib.contextmanager
    def _measuring(self, what: str):
        """Runs a measurement; one that raises warns once and is skipped from then on
        (the callbacks are no longer called), training goes on."""
        try:
            yield
        except Exception as error:  # a measurement must never stop training
            logger.debug("TrainingLoop: %s failed", what, exc_info=error)
            if what.startswith(("on_", "begin", "end")):
                self._hooks = None  # a half-called hook list measures nothing true
            self._warn_once(
                what,
                f"TrainingLoop stopped measuring after an error in {what}: "
                f"{type(error).__name__}: {error}. Training continues without it.",
            )

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warn_without_raising(message, MeasurementWarning)


class RunWatch:
    """Follows the calls of one strategy's ``run`` during a loop's steps: eager ones
    (outside any ``tf.function``: the replicas run one after another) and traced ones.

    ``install`` follows the strategy's ``run`` (``_followed_run``); ``remove`` stops,
    and the last loop to stop gives the strategy back its own. Only calls inside a step
    of this loop count (``start_step`` / ``end_step``), so two loops on one strategy
    count their own. A ``tf.function`` calls ``run`` only while it is traced.
    """

    def __init__(self):
        self.eager_calls = 0
        self.traced_calls = 0
        self.functions_run_eagerly = False
        self._run = None  # the strategy's followed run while installed
        self._in_step = False
        self._step_eager = self._step_traced = 0

    def install(self, strategy) -> None:
        if self._run is None:
            self._run = _followed_run(strategy)
            self._run.watches.append(self)

    def remove(self) -> None:
        run, self._run = self._run, None
        if run is None:
            return
        run.watches.remove(self)
        if not run.watches:
            run.restore()

    def called(self, tf) -> None:
        """A call of the strategy's run (counted inside this loop's steps)."""
        if self._in_step:
            self._seen(tf)

    def _seen(self, tf) -> None:
        if tf.inside_function():
            self.traced_calls += 1
            self._step_traced += 1
        else:
            self.eager_calls += 1
            self._step_eager += 1
            self.functions_run_eagerly |= bool(tf.config.functions_run_eagerly())

    def start_step(self) -> None:
        self._step_eager = self._step_traced = 0
        self._in_step = True

    def end_step(self) -> tuple[str, bool]:
        """(how this step ran strategy.run, whether tf.config.run_functions_eagerly was on)."""
        self._in_step = False
        if self._step_eager:
            mode = FUNCTIONS_RUN_EAGERLY if self.functions_run_eagerly else EAGER
        elif self._step_traced or self.traced_calls:
            # A traced function does not call run again: no call is a tf.function step.
            mode = IN_FUNCTION
        else:
            mode = UNSEEN
        return mode, self.functions_run_eagerly


def _followed_run(strategy):
    """The strategy's ``run`` with the loops that follow it (``watches``): one per
    strategy object, set as its attribute (the class's method stays as it is), so two
    loops on one strategy each count the calls of their own steps. ``restore()`` puts
    back what the attribute was."""
    import tensorflow as tf

    current = vars(strategy).get("run")
    if getattr(current, "watches", None) is not None:
        return current
    original = strategy.run

    @tf.autograph.experimental.do_not_convert
    def run(fn, args=(), kwargs=None, options=None):
        for watch in tuple(run.watches):
            watch.called(tf)
        return original(fn, args=args, kwargs=kwargs, options=options)

    def restore():
        if vars(strategy).get("run") is not run:
            return  # replaced since: leave what is there
        if current is None:
            del strategy.run
        else:
            strategy.run = current

    run.__doc__ = original.__doc__
    run.watches, run.restore = [], restore
    strategy.run = run
    return run


def _callback_list(callbacks: list, model):
    """Keras's CallbackList for ``model``'s Keras (3 or tf_keras), no history or
    progress bar: the loop calls its hooks as ``fit`` would."""
    if keras_package(model) == "tf_keras":
        from tf_keras.callbacks import CallbackList
    else:
        from keras.callbacks import CallbackList
    return CallbackList(callbacks, add_history=False, add_progbar=False, model=model)


def _sync_devices() -> None:
    """Waits for the devices' pending work (GPU kernels run asynchronously), as
    ``fit``'s batch-end hook waits for the step's logs."""
    import tensorflow as tf

    tf.test.experimental.sync_devices()
