"""Names that capture and analysis share, defined once: the step marker the profiler
writes and the analysis finds, where captures go, the environment variables, and how
a GPU is named. Standard library only, so every layer may import it.
"""

from __future__ import annotations

import re
from pathlib import Path

# Step markers: the profiler wraps each step in
# ``tf.profiler.experimental.Trace(STEP_EVENT_NAME, step_num=<global step>, _r=1,
# kdp=1)``; XProf and our analysis find steps by that host event.
STEP_EVENT_NAME = "train"
# Set on our own markers, to tell them from tf_keras's or user code's when several nest.
OWN_MARKER_STAT = "kdp"

# Captures: ``<log_dir>/PROFILE_RUN/PROFILE_SUBDIR/<capture>/<host>TRACE_SUFFIX``
# (TensorBoard's Profile tab lists PROFILE_RUN as a run).
PROFILE_RUN = "train"
PROFILE_SUBDIR = Path("plugins") / "profile"
TRACE_SUFFIX = ".xplane.pb"

# Environment variables: replicas for ``configure_devices``, the log dir a sweep gives
# each run, the run id launchers share across workers, how often per-step records are
# written (seconds; 0 writes every record at once).
REPLICAS_ENV = "KERAS_DP_REPLICAS"
LOG_DIR_ENV = "KERAS_DP_LOG_DIR"
RUN_ID_ENV = "KERAS_DP_RUN_ID"
FLUSH_SECONDS_ENV = "KERAS_DP_FLUSH_SECONDS"
# Set to 1: the test suite leaves GPUs visible (tests/conftest.py; make gpu-check sets it).
TEST_GPUS_ENV = "KERAS_DP_TEST_GPUS"
# Set in a tuning trial's process (tools.tuning.child): a tuning call there is refused.
TRIAL_PROCESS_ENV = "KERAS_DP_TRIAL_PROCESS"
# An empty file in a trial's log dir (compare_strategies, tune_allreduce): its runs are
# the tuning's evidence, which Report.load leaves out unless asked (trials=True), also
# when the comparison never finished.
TRIAL_MARKER = ".keras_dp_trial"

_GPU_DEVICE = re.compile(r"(?:^|/)(?:device:)?GPU:(\d+)$", re.IGNORECASE)


def step_marker_stats() -> dict[str, int]:
    """Keyword arguments (beyond ``step_num`` and ``_r``) of our step markers.

    Returns:
        The stat the analysis finds our markers by, and its value.
    """
    return {OWN_MARKER_STAT: 1}


def gpu_ordinal(device: str) -> int | None:
    """The GPU ordinal of a TensorFlow device name.

    Args:
        device: a device name (``/gpu:1``, ``/job:localhost/replica:0/task:0/device:GPU:1``).

    Returns:
        The ordinal, or None for other devices.

    Example:

    >>> from keras_dp_tools.records.contract import gpu_ordinal
    >>> gpu_ordinal("/job:localhost/replica:0/task:0/device:GPU:1"), gpu_ordinal("/cpu:0")
    (1, None)
    """
    match = _GPU_DEVICE.search(device.rstrip("/"))
    return int(match.group(1)) if match else None
