"""keras_dp_tools: profile and tune synchronous data-parallel Keras training.

Importing the package imports nothing heavy: names load on first use, so the records,
the report and the NVML reader work without TensorFlow (the NVML reader even without
pandas, e.g. on a GPU box checked with only ``nvidia-ml-py``). Callbacks import
TensorFlow when training starts.
"""

from keras_dp_tools.capture import EXPORTS as CAPTURE_EXPORTS  # a light import
from keras_dp_tools.common.lazy import lazy_exports

__version__ = "0.2.0"

# Public name -> defining module; ``(module, None)`` is the module itself (``plots``).
# The callbacks live in ``keras_dp_tools.capture``, so ``kdt.callbacks`` (the function)
# names no subpackage and cannot be shadowed by one.
_EXPORTS = {
    "callbacks": "keras_dp_tools.capture",
    "analyze_trace": "keras_dp_tools.analysis.breakdown.api",
    "Breakdown": "keras_dp_tools.analysis.breakdown.api",
    # One finding type; Advice and LintViolation are it, in their old argument order.
    "Advice": "keras_dp_tools.common.findings",
    "Finding": "keras_dp_tools.common.findings",
    "LintViolation": ("keras_dp_tools.checks.lint.checker", "Violation"),
    "lint_paths": "keras_dp_tools.checks.lint.runner",
    "plots": ("keras_dp_tools.report.plots", None),
    "Severity": "keras_dp_tools.common.severity",
    **CAPTURE_EXPORTS,
    "BatchScalingWarning": "keras_dp_tools.checks.batching",
    "check_batching": "keras_dp_tools.checks.batching",
    "configure_devices": "keras_dp_tools.setup.devices",
    "mirrored_strategy": "keras_dp_tools.setup.devices",
    "Report": "keras_dp_tools.report.facade",
    "replica_count": "keras_dp_tools.setup.scaling",
    "scale_batch_size": "keras_dp_tools.setup.scaling",
    "scale_learning_rate": "keras_dp_tools.setup.scaling",
    "ScalingPlan": "keras_dp_tools.setup.scaling",
    "plan_scaling": "keras_dp_tools.setup.scaling",
    "warmup_schedule": "keras_dp_tools.setup.schedules",
    "tune_allreduce": "keras_dp_tools.tools.tuning.allreduce",
    "compare_strategies": "keras_dp_tools.tools.strategies.compare",
    "StrategyComparison": "keras_dp_tools.tools.strategies.compare",
    "find_per_replica_batch": "keras_dp_tools.tools.tuning.batch_finder",
    "what_if": "keras_dp_tools.analysis.what_if",
}
__all__ = ["__version__", *sorted(_EXPORTS)]
__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
