"""Learning-rate warm-up as a Keras ``LearningRateSchedule``, for Keras 3 and tf_keras."""

from __future__ import annotations

import importlib
import os
from functools import cache

from keras_dp_tools.common.validation import require_positive_int, require_positive_number

PACKAGE = "keras_dp_tools"


class _WarmupMath:
    """Linear warm-up from ``start_lr`` to ``target_lr`` over ``warmup_steps``, then
    ``after(step)`` (the global step, not reset: as TF Model Garden's LinearWarmup), or
    ``target_lr``. Uses TensorFlow ops: both Keras flavours run on TensorFlow here."""

    def __init__(self, target_lr, warmup_steps, start_lr=0.0, after=None, name="warmup"):
        super().__init__()
        self.target_lr = float(target_lr)
        self.warmup_steps = int(warmup_steps)
        self.start_lr = float(start_lr)
        self.after = after
        self.name = name

    def __call__(self, step):
        import tensorflow as tf

        step = tf.cast(step, tf.float32)
        progress = tf.minimum(step / float(self.warmup_steps), 1.0)
        warming = self.start_lr + (self.target_lr - self.start_lr) * progress
        if self.after is None:
            later = tf.constant(self.target_lr, tf.float32)
        else:
            later = tf.cast(self.after(step), tf.float32)
        return tf.where(step < float(self.warmup_steps), warming, later)

    def get_config(self):
        after = None
        if self.after is not None:
            after = self._keras.optimizers.schedules.serialize(self.after)
        return {
            "target_lr": self.target_lr,
            "warmup_steps": self.warmup_steps,
            "start_lr": self.start_lr,
            "after": after,
            "name": self.name,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if config.get("after") is not None:
            config["after"] = cls._keras.optimizers.schedules.deserialize(config["after"])
        return cls(**config)


@cache
def warmup_class(keras_package: str):
    """The ``WarmupSchedule`` class for ``"keras"`` (Keras 3) or ``"tf_keras"``, registered
    for serialisation as ``keras_dp_tools>WarmupSchedule`` in that package."""
    if keras_package not in ("keras", "tf_keras"):
        raise ValueError(
            f"keras_package must be 'keras' or 'tf_keras', received {keras_package!r}."
        )
    keras = importlib.import_module(keras_package)
    base = keras.optimizers.schedules.LearningRateSchedule
    schedule = type(
        "WarmupSchedule", (_WarmupMath, base), {"_keras": keras, "__module__": __name__}
    )
    schedule.__doc__ = _WarmupMath.__doc__
    return keras.saving.register_keras_serializable(package=PACKAGE)(schedule)


def _package_of(after, keras_package: str | None) -> str:
    if keras_package is not None:
        return keras_package
    if after is not None and callable(getattr(after, "get_config", None)) is not False:
        module = type(after).__module__.split(".", 1)[0]
        if module in ("keras", "tf_keras"):
            return module
    return "tf_keras" if os.environ.get("TF_USE_LEGACY_KERAS") == "1" else "keras"


def warmup_schedule(
    target_lr: float,
    warmup_steps: int,
    start_lr: float | None = None,
    after=None,
    keras_package: str | None = None,
):
    """A learning-rate schedule that warms up linearly, then stays or hands over.

    Example:

    ```python
    import keras
    import keras_dp_tools as kdt

    lr = kdt.warmup_schedule(0.4, warmup_steps=500, start_lr=0.1)
    optimizer = keras.optimizers.SGD(learning_rate=lr, momentum=0.9)
    # Warm-up, then cosine decay over the whole run:
    decay = keras.optimizers.schedules.CosineDecay(0.4, decay_steps=10_000)
    lr = kdt.warmup_schedule(0.4, warmup_steps=500, after=decay)
    ```

    Args:
        target_lr: the rate reached at ``warmup_steps``.
        warmup_steps: steps of warm-up (positive).
        start_lr: the rate at step 0; default 0 (Horovod starts at ``target_lr /
            replicas``, Goyal et al. at the unscaled rate: pass it).
        after: a schedule (or callable of the step) used from ``warmup_steps`` on, given
            the global step; default: constant ``target_lr``.
        keras_package: ``"keras"`` or ``"tf_keras"``: whose ``LearningRateSchedule`` to
            build. Default: the package of ``after``, else tf_keras when
            ``TF_USE_LEGACY_KERAS=1``, else Keras 3.

    Returns:
        A serialisable ``LearningRateSchedule`` (``get_config`` / ``from_config``).
    """
    target_lr = require_positive_number("target_lr", target_lr)
    warmup_steps = require_positive_int("warmup_steps", warmup_steps)
    start_lr = 0.0 if start_lr is None else float(start_lr)
    if start_lr < 0:
        raise ValueError(f"start_lr must be >= 0, received {start_lr!r}.")
    schedule = warmup_class(_package_of(after, keras_package))
    return schedule(target_lr, warmup_steps, start_lr=start_lr, after=after)
