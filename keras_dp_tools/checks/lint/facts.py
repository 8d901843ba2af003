"""One parsed file and its facts for the KDP checks (no cross-file work)."""

from __future__ import annotations

import ast

from keras_dp_tools.checks.lint.contracts import per_replica_contracts
from keras_dp_tools.checks.lint.intent import commented_global, divided_names, says_global
from keras_dp_tools.checks.lint.reach import distributed_data
from keras_dp_tools.checks.lint.scopes import Collector, Scope, sequence_classes


class Module:
    """One parsed file: its scopes, imports, strategies, per-replica contracts, stated
    intent and the data its strategies distribute. ``lines``: its source lines, for the
    comments that state intent (read from ``path`` when not given)."""

    def __init__(self, tree: ast.Module, path=None, lines: list[str] | None = None):
        self.path = path  # a pathlib.Path for project files, None for a bare source
        if lines is None and path is not None:
            try:
                lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
            except OSError:
                lines = None
        self.lines = lines
        self.collector = Collector(sequence_classes(tree))
        self.collector.visit(tree)
        self._propagate_strategy_arguments()
        self.contracts = per_replica_contracts(tree)
        self.divided = divided_names(tree)
        self.reach = distributed_data(self.collector)

    def _propagate_strategy_arguments(self):
        """A module function called with a strategy receives one (to a fixpoint)."""
        changed = True
        while changed:
            changed = False
            for scope in self.collector.scopes:
                for call in scope.calls:
                    if not isinstance(call.func, ast.Name):
                        continue
                    callee = self.collector.functions.get(call.func.id)
                    if callee is None:
                        continue
                    passed = [
                        (callee.parameters[index] if index < len(callee.parameters) else None, arg)
                        for index, arg in enumerate(call.args)
                    ] + [(keyword.arg, keyword.value) for keyword in call.keywords]
                    for parameter, value in passed:
                        if (
                            parameter
                            and parameter not in callee.strategy_names
                            and self.collector.is_strategy_value(value, call.lineno, scope)
                        ):
                            callee.strategy_names[parameter] = callee.node.lineno
                            callee.received = True
                            changed = True

    def says_global(self, name: str, values: list[ast.expr]) -> bool:
        """Whether the code states that ``name`` (given ``values``) is the global batch."""
        return (
            says_global(name)
            or name in self.divided
            or any(commented_global(self.lines, value) for value in values)
        )

    def per_replica(self, scope: Scope) -> bool:
        """Whether ``scope`` is, or is inside, a function that is per replica by contract."""
        current = scope
        while current is not None:
            if self.contracts.covers_function(current.node):
                return True
            current = current.parent
        return False

    def strategy_at(self, scope: Scope, line: int) -> bool:
        """Whether a strategy exists at ``line`` of ``scope``: created earlier in it,
        received, held on ``self``, or existing where an enclosing function was defined;
        or the scope makes data a strategy distributes."""
        current = scope
        while current is not None:
            if current.received:
                return True
            if current.strategy_line is not None and current.strategy_line < line:
                return True
            attrs = self.collector.class_strategy_attrs.get(current.class_name or "", set())
            if attrs & current.uses_self_attrs:
                return True
            if current.name in self.reach.functions:
                return True
            line = getattr(current.node, "lineno", line)
            current = current.parent
        return False

    def any_strategy(self) -> bool:
        return any(
            scope.received or scope.creates_strategy for scope in self.collector.scopes
        ) or bool(self.collector.class_strategy_attrs)
