"""The breakdown: one profiler trace -> per step and replica, compute, all-reduce (sync
wait and transfer), input and the rest, with bytes and bandwidths.

The stages, in the order a trace goes through them: ``host_reading`` (host events into
``spans``, classified by ``classify``; GPU planes by ``gpu_trace``, which GPUs are
replicas by ``device_roles``; the steps by ``step_sources``: markers, else XProf's step
grouping, else the whole capture; the facts nobody gave by ``unknown_facts``),
``marker_checks``
(step markers that cannot be true), ``replicas`` (CPU replica attribution),
``step_engine`` (each step's intervals and waits), ``rows`` and ``bandwidth`` (the
rows and nccl-tests' bandwidths), ``xprof_steps`` (XProf's own step numbers beside
ours). ``api`` holds the entry points (``analyze_window``, ``analyze_trace``,
``analyze_xspace``) and ``Breakdown``; they load here on first use.
"""

from keras_dp_tools.common.lazy import lazy_exports

_EXPORTS = dict.fromkeys(
    ("Breakdown", "analyze_window", "analyze_trace", "analyze_xspace"),
    "keras_dp_tools.analysis.breakdown.api",
)
__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
__all__ = sorted(_EXPORTS)
