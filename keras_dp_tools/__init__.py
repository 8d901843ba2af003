"""keras_dp_tools: profile and tune synchronous data-parallel Keras training.

Importing the package does not import TensorFlow: the records, the report and the
NVML reader work without it. Callbacks import TensorFlow when training starts.
"""

__version__ = "0.1.0"

from keras_dp_tools.callbacks import (
    DataParallelCallback,
    DataParallelProfiler,
    MeasurementWarning,
    StepTimer,
    callbacks,
)
from keras_dp_tools.devices import configure_devices, mirrored_strategy
from keras_dp_tools.report import Report
from keras_dp_tools.scaling import replica_count, scale_batch_size

__all__ = [
    "DataParallelCallback",
    "DataParallelProfiler",
    "MeasurementWarning",
    "Report",
    "StepTimer",
    "__version__",
    "callbacks",
    "configure_devices",
    "mirrored_strategy",
    "replica_count",
    "scale_batch_size",
]
