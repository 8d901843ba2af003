"""keras_dp_tools: profile and tune synchronous data-parallel Keras training.

Importing the package imports nothing heavy: names load on first use, so the records,
the report and the NVML reader work without TensorFlow (the NVML reader even without
pandas, e.g. on a GPU box checked with only ``nvidia-ml-py``). Callbacks import
TensorFlow when training starts.
"""

from keras_dp_tools._lazy import lazy_exports

__version__ = "0.1.0"

# The function, bound after its subpackage of the same name is imported (which is
# light): later imports of callback modules then leave this name alone.
from keras_dp_tools.callbacks import callbacks

_EXPORTS = {
    "BatchScalingCheck": "keras_dp_tools.callbacks.batch_scaling_check",
    "BatchScalingWarning": "keras_dp_tools.batching",
    "check_batching": "keras_dp_tools.batching",
    "DataParallelCallback": "keras_dp_tools.callbacks.base",
    "MeasurementWarning": "keras_dp_tools.callbacks.base",
    "StrategyWarning": "keras_dp_tools.callbacks.base",
    "DataParallelProfiler": "keras_dp_tools.callbacks.data_parallel_profiler",
    "GpuMonitor": "keras_dp_tools.callbacks.gpu_monitor",
    "RunAdvisor": "keras_dp_tools.callbacks.run_advisor",
    "StepTimer": "keras_dp_tools.callbacks.step_timer",
    "configure_devices": "keras_dp_tools.devices",
    "mirrored_strategy": "keras_dp_tools.devices",
    "Report": "keras_dp_tools.report",
    "replica_count": "keras_dp_tools.scaling",
    "scale_batch_size": "keras_dp_tools.scaling",
    "scale_learning_rate": "keras_dp_tools.scaling",
    "ScalingPlan": "keras_dp_tools.scaling",
    "plan_scaling": "keras_dp_tools.scaling",
    "warmup_schedule": "keras_dp_tools.schedules",
    "tune_allreduce": "keras_dp_tools.tuning.allreduce",
    "find_per_replica_batch": "keras_dp_tools.tuning.batch_finder",
    "what_if": "keras_dp_tools.analysis.what_if",
}
__all__ = ["__version__", "callbacks", *sorted(_EXPORTS)]
__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
