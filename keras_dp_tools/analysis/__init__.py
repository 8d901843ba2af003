"""Layer 2, analysis: pure functions over profiler traces (``trace``) and record frames;
no TensorFlow session, no training needed.

May import: ``common``, ``records``.
"""

from keras_dp_tools.analysis.breakdown import (
    Breakdown,
    analyze_trace,
    analyze_window,
    analyze_xspace,
)
from keras_dp_tools.analysis.trace.xspace import find_traces, load_xspace
from keras_dp_tools.records.columns import REPLICA_COLUMNS, STEP_COLUMNS, XPROF_COLUMNS

__all__ = [
    "REPLICA_COLUMNS",
    "STEP_COLUMNS",
    "XPROF_COLUMNS",
    "Breakdown",
    "analyze_trace",
    "analyze_window",
    "analyze_xspace",
    "find_traces",
    "load_xspace",
]
