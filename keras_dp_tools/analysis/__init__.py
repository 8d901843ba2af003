"""Analysis layer: pure functions over profiler traces and records; no training needed."""

from keras_dp_tools.analysis.breakdown import Breakdown, analyze_trace, analyze_xspace
from keras_dp_tools.analysis.xspace import find_traces, load_xspace
from keras_dp_tools.schema import REPLICA_COLUMNS, STEP_COLUMNS, XPROF_COLUMNS

__all__ = [
    "REPLICA_COLUMNS",
    "STEP_COLUMNS",
    "XPROF_COLUMNS",
    "Breakdown",
    "analyze_trace",
    "analyze_xspace",
    "find_traces",
    "load_xspace",
]
