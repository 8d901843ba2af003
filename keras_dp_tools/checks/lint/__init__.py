"""Static check for batches not scaled by the replica count (``keras-dp lint``, flake8 KDP).

Parses with ``ast`` only: the user's code is never imported or run.
"""

from keras_dp_tools.checks.lint.checker import CODES, SEVERITIES, Violation, check_source
from keras_dp_tools.checks.lint.runner import Project, Summary, lint_paths

__all__ = [
    "CODES",
    "SEVERITIES",
    "Project",
    "Summary",
    "Violation",
    "check_source",
    "lint_paths",
]
