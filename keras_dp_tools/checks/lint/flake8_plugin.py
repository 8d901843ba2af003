"""The flake8 plugin: ``flake8 --select KDP`` runs the same checks as ``keras-dp lint``.

Registered under the ``flake8.extension`` entry point group with the code prefix
``KDP``; flake8 itself handles ``# noqa`` and output. flake8 checks one file at a time:
the imports of the checked file are followed on disk as ``keras-dp lint`` does.
"""

from __future__ import annotations

import ast
from pathlib import Path

import keras_dp_tools
from keras_dp_tools.checks.lint.checker import Checker, check_tree
from keras_dp_tools.checks.lint.runner import Project

# One per flake8 process (a short-lived run): files imported by several checked files,
# or checked after being imported, are parsed once.
_PROJECT = Project()


class KerasDpChecker:
    """flake8 AST plugin: yields ``(line, col, "KDPnnn message", type)``."""

    name = "keras-dp-tools"
    version = keras_dp_tools.__version__

    def __init__(self, tree: ast.Module, filename: str = "stdin", lines=None):
        self.tree = tree
        self.filename = filename
        self.lines = [line.rstrip("\r\n") for line in lines] if lines is not None else None

    def run(self):
        if Path(self.filename).is_file():
            module = _PROJECT.parsed(self.filename) or _PROJECT.register(
                self.filename, self.tree, self.lines
            )
            violations = Checker(module, _PROJECT).violations()
        else:  # stdin: nothing to follow imports from
            violations = check_tree(self.tree, lines=self.lines)
        for violation in violations:
            yield violation.line, violation.col, f"{violation.code} {violation.message}", type(self)
