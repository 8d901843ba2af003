"""The flake8 plugin: ``flake8 --select KDP`` runs the same checks as ``keras-dp lint``.

Registered under the ``flake8.extension`` entry point group with the code prefix
``KDP``; flake8 itself handles ``# noqa`` and output. flake8 checks one file at a time:
the imports of the checked file are followed on disk as ``keras-dp lint`` does.
"""

from __future__ import annotations

import ast
from pathlib import Path

import keras_dp_tools
from keras_dp_tools.lint.checker import check_tree
from keras_dp_tools.lint.runner import Project


class KerasDpChecker:
    """flake8 AST plugin: yields ``(line, col, "KDPnnn message", type)``."""

    name = "keras-dp-tools"
    version = keras_dp_tools.__version__

    def __init__(self, tree: ast.Module, filename: str = "stdin"):
        self.tree = tree
        self.filename = filename

    def run(self):
        project = Project() if Path(self.filename).is_file() else None
        filename = self.filename if project is not None else None
        for violation in check_tree(self.tree, filename, project):
            yield violation.line, violation.col, f"{violation.code} {violation.message}", type(self)
