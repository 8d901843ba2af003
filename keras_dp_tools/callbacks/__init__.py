"""Capture layer: Keras callbacks that record data-parallel training (Keras 3 and tf_keras)."""

from keras_dp_tools.callbacks.base import DataParallelCallback, MeasurementWarning
from keras_dp_tools.callbacks.step_timer import StepTimer


def callbacks(log_dir, *, global_batch: int | None = None, tensorboard: bool = True) -> list:
    """The recommended keras_dp_tools callbacks for ``model.fit``, all writing to ``log_dir``.

    Example:

    ```python
    model.fit(dataset, epochs=3,
              callbacks=kdt.callbacks("runs/exp1", global_batch=global_batch))
    ```

    Args:
        log_dir: the run folder (the one you would give ``keras.callbacks.TensorBoard``).
        global_batch: examples per step over all replicas, for throughput.
        tensorboard: write TensorBoard scalars next to the records.

    Returns:
        A list of callbacks; add your own to it.
    """
    return [StepTimer(log_dir, global_batch=global_batch, tensorboard=tensorboard)]


__all__ = ["DataParallelCallback", "MeasurementWarning", "StepTimer", "callbacks"]
