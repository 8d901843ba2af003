"""Base class of our callbacks: one implementation for Keras 3 and legacy tf_keras.

Both Keras flavours drive callbacks by duck typing (``set_model``, ``set_params``,
``on_*`` hooks) and detect which batch hooks a callback overrides through a
``_is_default`` marker on the base methods. Subclassing neither Keras's nor
tf_keras's ``Callback`` lets one class serve a model of either flavour, and keeps
``import keras_dp_tools`` free of TensorFlow.

The base also enforces the rule that a measurement never stops training: any
exception in a hook is turned into one warning, after which the callback stops
measuring and training carries on. Under ``ParameterServerStrategy`` (asynchronous
training, which tf_keras runs only without batch-level callbacks) the batch hooks are
switched off and one ``StrategyWarning`` says what is still recorded.
"""

from __future__ import annotations

import functools
import logging
import sys
import weakref

from keras_dp_tools.common.known_bugs import ALLREDUCE_BUG, ALLREDUCE_FIX, drops_gradient_allreduce
from keras_dp_tools.common.warn import warn, warn_without_raising

logger = logging.getLogger("keras_dp_tools")

HOOKS = tuple(
    f"on_{name}"
    for name in (
        "train_begin",
        "train_end",
        "epoch_begin",
        "epoch_end",
        "batch_begin",
        "batch_end",
        "train_batch_begin",
        "train_batch_end",
        "test_begin",
        "test_end",
        "test_batch_begin",
        "test_batch_end",
        "predict_begin",
        "predict_end",
        "predict_batch_begin",
        "predict_batch_end",
    )
)


class MeasurementWarning(UserWarning):
    """A keras_dp_tools callback could not measure and stopped; training went on.

    Example:

    ```python
    import warnings
    import keras_dp_tools as kdt

    # Fail the run instead of training on without measurements:
    warnings.simplefilter("error", kdt.MeasurementWarning)
    ```
    """


class StrategyWarning(UserWarning):
    """The strategy trains in a way the per-step breakdown does not measure; the
    callbacks record what they still can.

    Example:

    ```python
    import warnings
    import keras_dp_tools as kdt

    warnings.simplefilter("ignore", kdt.StrategyWarning)  # said once per strategy anyway
    ```
    """


PARAMETER_SERVER_NOTE = (
    "{strategy} trains asynchronously: workers read variables from parameter servers "
    "and push their updates, with no all-reduce between replicas, and tf_keras runs no "
    "batch-level callbacks under it. keras_dp_tools's step times and compute/all-reduce "
    "breakdown measure synchronous data parallelism (MirroredStrategy, "
    "MultiWorkerMirroredStrategy), so StepTimer and DataParallelProfiler record no steps "
    "here. Still recorded: the run header, the batching check and scaling plan "
    "(BatchScalingCheck), the advice at the end of fit (RunAdvisor), and GpuMonitor's "
    "readings of this (the coordinator's) host: CPU usage per epoch, GPUs until its "
    "idle_timeout, as no steps arrive. To profile the workers, use "
    "tf.profiler.experimental.client.trace."
)
_noted_strategies: weakref.WeakSet = weakref.WeakSet()


def parameter_server_strategy(strategy) -> bool:
    """Whether ``strategy`` is a parameter-server strategy (V1 or V2).

    Args:
        strategy: a ``tf.distribute`` strategy, or None.

    Returns:
        True for ``ParameterServerStrategy`` (either version, or a subclass).
    """
    return any("ParameterServerStrategy" in cls.__name__ for cls in type(strategy).__mro__)


def parameter_server_training(model) -> bool:
    """Whether ``model`` is fit under a parameter-server strategy (V1 or V2).

    Args:
        model: the Keras model being fit.

    Returns:
        ``parameter_server_strategy`` of the model's strategy.
    """
    return parameter_server_strategy(getattr(model, "distribute_strategy", None))


def _note_parameter_servers(strategy) -> None:
    """Says once per strategy object, for all our callbacks, what they record under it."""
    if strategy in _noted_strategies:
        return
    _noted_strategies.add(strategy)
    message = PARAMETER_SERVER_NOTE.format(strategy=type(strategy).__name__)
    logger.info(message)
    warn_without_raising(message, StrategyWarning)


def keras_package(model) -> str:
    """Which Keras the model is built with, from its classes: a subclass of
    ``keras.Model`` lives in the user's module, its base in Keras's.

    Args:
        model: a Keras model (Keras 3 or tf_keras).

    Returns:
        ``"keras"`` (Keras 3) or ``"tf_keras"`` (legacy); the first class's package when
        neither is among its bases.
    """
    packages = [cls.__module__.split(".", 1)[0] for cls in type(model).__mro__]
    return next((name for name in packages if name in ("keras", "tf_keras")), packages[0])


def _note_known_bug(model) -> None:
    """Says once per strategy object, before the first step, when this Keras is known
    not to all-reduce gradients under it (the advisor says it again from the trace)."""
    strategy = getattr(model, "distribute_strategy", None)
    if strategy is None or strategy in _noted_strategies:
        return
    package = keras_package(model)
    version = getattr(sys.modules.get(package), "__version__", None)
    mirrored = any("Mirrored" in cls.__name__ for cls in type(strategy).__mro__)
    replicas = getattr(strategy, "num_replicas_in_sync", 1)
    if mirrored and replicas > 1 and drops_gradient_allreduce(package, version):
        _noted_strategies.add(strategy)
        bug = ALLREDUCE_BUG.format(
            version=version, strategy=type(strategy).__name__, replicas=replicas
        )
        warn_without_raising(f"{bug}. {ALLREDUCE_FIX}", StrategyWarning)


def _default(method):
    # The marker both Keras 3 and tf_keras read to skip hooks nobody overrides.
    method._is_default = True
    return method


def _guarded(hook):
    @functools.wraps(hook)
    def run_hook(self, *args, **kwargs):
        if self._failed:
            return None
        try:
            return hook(self, *args, **kwargs)
        except Exception as error:  # a measurement must never stop training
            self._fail(hook.__name__, error)
            return None

    return run_hook


class DataParallelCallback:
    """Keras callback base that works with Keras 3 and tf_keras models.

    Subclasses override ``on_*`` hooks as with ``keras.callbacks.Callback``. A hook
    that raises is reported once as a ``MeasurementWarning``; the callback then goes
    quiet (``failed`` becomes True) and ``_on_failure`` releases its resources.

    Example:

    ```python
    import time
    import keras_dp_tools as kdt

    class EpochClock(kdt.DataParallelCallback):
        def on_epoch_begin(self, epoch, logs=None):
            self.started = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            print(f"epoch {epoch}: {time.perf_counter() - self.started:.1f} s")

    model.fit(x, y, epochs=2, callbacks=[EpochClock()])  # Keras 3 or tf_keras
    ```
    """

    # tf_keras: hand us numpy logs, so a batch-end hook runs after the step finished.
    _supports_tf_logs = False
    # Keras 3: run batch-end hooks on the training thread, in step order.
    async_safe = False
    _chief_worker_only = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name in HOOKS:
            hook = cls.__dict__.get(name)
            if hook is not None and not getattr(hook, "_is_default", False):
                setattr(cls, name, _guarded(hook))

    def __init__(self):
        self.params = None
        self._model = None
        self._failed = False
        self._recorder = None  # a Recorder while a fit runs (Recorder.for_fit)
        self._parameter_servers = False  # asynchronous training: no batch hooks

    @property
    def model(self):
        return self._model

    @property
    def failed(self) -> bool:
        """True once a hook raised and the callback stopped measuring."""
        return self._failed

    def set_params(self, params):
        self.params = params

    def set_model(self, model):
        self._model = model
        self._parameter_servers = parameter_server_training(model)
        if self._parameter_servers:
            _note_parameter_servers(model.distribute_strategy)
        else:
            _note_known_bug(model)

    def _fail(self, hook_name: str, error: BaseException) -> None:
        self._failed = True
        message = (
            f"{type(self).__name__} stopped measuring after an error in {hook_name}: "
            f"{type(error).__name__}: {error}. Training continues without it."
        )
        logger.debug(message, exc_info=error)
        warn(message, MeasurementWarning)
        try:
            self._on_failure()
        except Exception as cleanup_error:
            logger.debug("cleanup after failure raised", exc_info=cleanup_error)

    def _on_failure(self) -> None:
        """Releases what the callback holds after a failed hook (override)."""
        self._release_recorder()

    def _release_recorder(self) -> None:
        """Gives back the recorder this callback holds, if any."""
        recorder, self._recorder = self._recorder, None
        if recorder is not None:
            recorder.release()

    # tf_keras asks these three whether to call the batch hooks at all.
    def _implements_train_batch_hooks(self):
        return self._overrides_any(
            "batch_begin", "batch_end", "train_batch_begin", "train_batch_end"
        )

    def _implements_test_batch_hooks(self):
        return self._overrides_any("test_batch_begin", "test_batch_end")

    def _implements_predict_batch_hooks(self):
        return self._overrides_any("predict_batch_begin", "predict_batch_end")

    def _overrides_any(self, *hooks: str) -> bool:
        if self._parameter_servers:  # tf_keras refuses to fit with batch-level callbacks
            return False
        return any(not getattr(getattr(self, f"on_{hook}"), "_is_default", False) for hook in hooks)


def find_in_fit(match, depth: int = 12):
    """The first value other than None that ``match(frame_locals)`` returns for the
    frames calling us, nearest first (up to ``depth`` of them); None if none does.

    Keras and tf_keras give callbacks no handle on ``fit``'s data or on the other
    callbacks of the fit; ``fit`` and its ``CallbackList`` hold them as locals a few
    frames up from a hook.

    Args:
        match: called with each frame's locals; returns what it looks for, or None.
        depth: the most frames to look at.

    Returns:
        The first value found, or None.
    """
    frame = sys._getframe(1)
    for _ in range(depth):
        if frame is None:
            return None
        found = match(frame.f_locals)
        if found is not None:
            return found
        frame = frame.f_back
    return None


@_default
def _ignore_hook(self, *args, **kwargs):
    """Does nothing: Keras calls hooks as ``(batch_or_epoch, logs)`` or ``(logs)``."""


for _hook_name in HOOKS:
    setattr(DataParallelCallback, _hook_name, _ignore_hook)
