"""Layer 2, analysis: pure functions over profiler traces and record frames; no
TensorFlow session, no training needed.

- ``trace``: reading XPlane files (parsing only);
- ``breakdown``: one trace -> per step and replica, compute, all-reduce, input, ...;
- a run's frames: ``run_frames`` (``RunFrames``, and ``load_run_frames``: records ->
  ``record_tables`` -> ``jobs`` (merged) -> ``frames``, ``attempts``, ``clocks``,
  ``step_parts`` -> the frames; their columns in ``frame_columns``);
- the analyzers over them: ``summary``, ``measured_steps``, ``workers``, the advice
  (``run_advice``: ``advice`` by topic, ``job_advice``), ``utilization``, ``what_if``,
  and ``strategies`` (a strategy comparison's table and verdict); ``ps_traffic`` (a
  parameter-server worker's trace -> its variable reads, gradient pushes and waits per step);
- ``runner``: the one door from capture into the analysis (a window, a finished run).

Names load on first use, so a callback importing the runner stays light.

May import: ``common``, ``records``.
"""

from keras_dp_tools.common.lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(
        ("Breakdown", "analyze_trace", "analyze_window", "analyze_xspace"),
        "keras_dp_tools.analysis.breakdown.api",
    ),
    "find_traces": "keras_dp_tools.analysis.trace.xspace",
    "load_xspace": "keras_dp_tools.analysis.trace.xspace",
    # The breakdown's columns (``Breakdown.replicas``, ``.steps``, XProf's): the
    # records' names; a run's frames have their own (``frame_columns``).
    **dict.fromkeys(
        ("REPLICA_COLUMNS", "STEP_COLUMNS", "XPROF_COLUMNS"), "keras_dp_tools.records.columns"
    ),
}
__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
__all__ = sorted(_EXPORTS)
