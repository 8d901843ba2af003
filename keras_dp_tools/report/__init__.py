"""Layer 4, report (presentation): ``kdt.Report`` over a log dir's records, its text,
plots, the HTML page and the TensorBoard "Data parallel" dashboard.

Reads records and asks the analysis; never imports capture, so a report works where
nothing was trained (no TensorFlow, no GPU).

May import: ``common``, ``records``, ``analysis``, ``setup``, ``checks``.
"""

from keras_dp_tools.common.lazy import lazy_exports

_EXPORTS = {"Report": "keras_dp_tools.report.facade"}
__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
__all__ = ["Report"]
