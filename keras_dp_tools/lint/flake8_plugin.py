"""The flake8 plugin: ``flake8 --select KDP`` runs the same checks as ``keras-dp lint``.

Registered under the ``flake8.extension`` entry point group with the code prefix
``KDP``; flake8 itself handles ``# noqa`` and output.
"""

from __future__ import annotations

import ast

import keras_dp_tools
from keras_dp_tools.lint.checker import check_tree


class KerasDpChecker:
    """flake8 AST plugin: yields ``(line, col, "KDPnnn message", type)``."""

    name = "keras-dp-tools"
    version = keras_dp_tools.__version__

    def __init__(self, tree: ast.Module):
        self.tree = tree

    def run(self):
        for violation in check_tree(self.tree):
            yield violation.line, violation.col, f"{violation.code} {violation.message}", type(self)
