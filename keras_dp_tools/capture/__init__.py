"""Layer 5, capture: Keras callbacks that record data-parallel training (Keras 3 and tf_keras).

``kdt.callbacks(log_dir)`` (defined here) is the one-line entry.

The callback classes load on first use (``keras_dp_tools.capture.StepTimer``), so
importing this package stays light.

May import: ``common``, ``records``, ``setup``, ``checks``, and of the analysis only
its runner (``analysis.runner``), which analyses a finished window or run without the
callbacks holding any analysis themselves.
"""

from keras_dp_tools.common.lazy import lazy_exports

EXPORTS = {
    "BatchScalingCheck": "keras_dp_tools.capture.batch_scaling_check",
    "DataParallelCallback": "keras_dp_tools.capture.base",
    "MeasurementWarning": "keras_dp_tools.capture.base",
    "StrategyWarning": "keras_dp_tools.capture.base",
    "NoGpuWarning": "keras_dp_tools.capture.gpu_monitor",
    "DataParallelProfiler": "keras_dp_tools.capture.data_parallel_profiler",
    "GpuMonitor": "keras_dp_tools.capture.gpu_monitor",
    "RunAdvisor": "keras_dp_tools.capture.run_advisor",
    "StepTimer": "keras_dp_tools.capture.step_timer",
    "TrainingLoop": "keras_dp_tools.capture.training_loop",
}
__getattr__, __dir__ = lazy_exports(__name__, globals(), EXPORTS)


def callbacks(
    log_dir,
    *,
    global_batch: int | None = None,
    tensorboard: bool = True,
    profile: bool = True,
    profile_start_step: int = 10,
    profile_every: int | None = None,
    monitor: bool = True,
    monitor_interval: float = 0.1,
    dataset=None,
    per_replica_batch: int | None = None,
    plan=None,
    advise: bool = True,
) -> list:
    """The recommended keras_dp_tools callbacks for ``model.fit``, all writing to ``log_dir``.

    Example:

    ```python
    model.fit(dataset, epochs=3,
              callbacks=kdt.callbacks("runs/exp1", global_batch=global_batch))
    ```

    Args:
        log_dir: the run folder (the one you would give ``keras.callbacks.TensorBoard``).
        global_batch: examples per step over all replicas, for throughput, when
            fit's data does not say it (read from fit by default; see StepTimer).
        tensorboard: write TensorBoard scalars next to the records.
        profile: capture profiler windows and break steps down into compute and
            all-reduce (``DataParallelProfiler``).
        profile_start_step: global step of the first profiler window.
        profile_every: steps between profiler windows; None captures one window.
        monitor: sample GPU (NVML) and CPU usage (``GpuMonitor``).
        monitor_interval: seconds between readings.
        dataset: the dataset given to ``fit``: checked before the first step
            (``BatchScalingCheck``, which is always there to check that ``fit`` trains
            data-parallel at all), with ``per_replica_batch`` if you say it. For
            arrays (``fit(x, y, batch_size=...)``) give only ``per_replica_batch``: the
            batch ``fit`` makes is read.
        per_replica_batch: the examples per replica you intend.
        plan: a ``kdt.ScalingPlan`` to record (and to check against the strategy).
        advise: write the advisor's findings to TensorBoard's Text tab when ``fit``
            ends (``RunAdvisor``).

    Returns:
        A list of callbacks; add your own to it.
    """
    from keras_dp_tools.capture.batch_scaling_check import BatchScalingCheck
    from keras_dp_tools.capture.data_parallel_profiler import DataParallelProfiler
    from keras_dp_tools.capture.gpu_monitor import GpuMonitor
    from keras_dp_tools.capture.run_advisor import RunAdvisor
    from keras_dp_tools.capture.step_timer import StepTimer

    chosen = [StepTimer(log_dir, global_batch=global_batch, tensorboard=tensorboard)]
    if profile:
        chosen.append(
            DataParallelProfiler(
                log_dir,
                start_step=profile_start_step,
                every=profile_every,
                tensorboard=tensorboard,
            )
        )
    if monitor:
        chosen.append(GpuMonitor(log_dir, interval=monitor_interval, tensorboard=tensorboard))
    if advise and tensorboard:
        chosen.append(RunAdvisor(log_dir))
    # Always before the first step: is fit data-parallel at all? The batch itself is
    # checked when there is something to check it against.
    check_batch = dataset is not None or plan is not None or per_replica_batch is not None
    chosen.insert(
        0,
        BatchScalingCheck(
            dataset, per_replica_batch, log_dir=log_dir, plan=plan, check_batch=check_batch
        ),
    )
    return chosen


__all__ = ["callbacks", *sorted(EXPORTS)]
