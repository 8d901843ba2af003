"""Devices for a data-parallel run: the GPUs, or a CPU split into logical devices.

Without a GPU, ``MirroredStrategy`` over several logical CPU devices still runs
real ``CollectiveReduceV2`` all-reduces, so the whole toolkit can be tried (and
tested) on a laptop. TensorFlow allows the split only before it initialises its
devices, so call ``configure_devices`` first thing in the program.
"""

from __future__ import annotations

import os

from keras_dp_tools.common.validation import require_positive_int
from keras_dp_tools.records.contract import REPLICAS_ENV, gpu_ordinal

DEFAULT_CPU_REPLICAS = 4
__all__ = ["REPLICAS_ENV", "configure_devices", "gpu_ordinal", "mirrored_strategy"]


def requested_replicas(replicas: int | None) -> int | None:
    """``replicas`` checked, else ``KERAS_DP_REPLICAS`` (None when neither is set)."""
    if replicas is not None:
        return require_positive_int("replicas", replicas)
    env = os.environ.get(REPLICAS_ENV, "").strip()
    if not env:
        return None
    try:
        return require_positive_int(REPLICAS_ENV, int(env))
    except ValueError:
        raise ValueError(f"{REPLICAS_ENV} must be a positive integer, received {env!r}.") from None


def configure_devices(replicas: int | None = None) -> list[str]:
    """Returns the device names a ``MirroredStrategy`` should use.

    With GPUs visible to TensorFlow: the first ``replicas`` GPUs (all by default).
    Without (none, or hidden with ``tf.config.set_visible_devices([], "GPU")``): the CPU split
    into ``replicas`` logical devices (default 4). ``replicas=None`` reads the
    ``KERAS_DP_REPLICAS`` environment variable first, so a sweep can set it.

    Example:

    ```python
    import keras_dp_tools as kdt
    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy(kdt.configure_devices(2))
    print(strategy.num_replicas_in_sync)  # 2
    ```

    Args:
        replicas: how many replicas (devices) to use; None for the default.

    Raises:
        ValueError: more replicas were asked for than there are GPUs.
        RuntimeError: TensorFlow already initialised fewer logical CPUs than asked.
    """
    import tensorflow as tf

    replicas = requested_replicas(replicas)
    # Visible ones: tf.config.set_visible_devices([], "GPU") means a CPU run.
    gpus = tf.config.get_visible_devices("GPU")
    if gpus:
        replicas = replicas or len(gpus)
        if replicas > len(gpus):
            raise ValueError(
                f"Asked for {replicas} replicas but only {len(gpus)} GPU(s) are visible "
                f"({', '.join(gpu.name for gpu in gpus)}). Ask for at most {len(gpus)}, "
                "or check CUDA_VISIBLE_DEVICES."
            )
        return [f"/gpu:{index}" for index in range(replicas)]

    replicas = replicas or DEFAULT_CPU_REPLICAS
    cpu = tf.config.list_physical_devices("CPU")[0]
    configured = tf.config.get_logical_device_configuration(cpu) or []
    if len(configured) < replicas:
        try:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration()] * replicas
            )
        except RuntimeError:
            available = len(tf.config.list_logical_devices("CPU"))
            if available < replicas:
                raise RuntimeError(
                    f"Cannot split the CPU into {replicas} logical devices: TensorFlow "
                    f"already initialised its devices ({available} CPU device(s)). Call "
                    "kdt.configure_devices() before any TensorFlow op runs, or set "
                    f"{REPLICAS_ENV}={replicas} and call it at the start of the program."
                ) from None
    return [f"/cpu:{index}" for index in range(replicas)]


def mirrored_strategy(replicas: int | None = None):
    """A ``tf.distribute.MirroredStrategy`` over ``configure_devices(replicas)``.

    Create one per process and device set and reuse it: a second strategy over the
    same devices can break collective ops ("Shape mismatch in the collective instance").
    """
    import tensorflow as tf

    return tf.distribute.MirroredStrategy(configure_devices(replicas))
