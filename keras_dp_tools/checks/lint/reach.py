"""What a strategy distributes: the data it is given, followed back to where it is made.

Data reaches the strategy when it is given to ``strategy.experimental_distribute_dataset``,
to ``strategy.run``, or to ``fit``/``evaluate``/``predict`` of a model built under
``strategy.scope()``. From there it is followed back through the assignments that made it
(``ds = ds.with_options(o)``, ``train, val = make_datasets()``) to the batch that made it
and the functions whose results it is.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from keras_dp_tools.checks.lint.scopes import GLOBAL_BATCH_METHODS, Collector, Scope

DISTRIBUTE_CALLS = {"experimental_distribute_dataset", "distribute_dataset"}
RUN_CALLS = {"run", "experimental_run_v2", "experimental_run"}
DATA_KEYWORDS = {"x", "validation_data", "args"}


@dataclass
class Reach:
    """Names (as ``(id of the defining scope, name)``), module functions and calls whose
    data the strategy distributes."""

    names: set[tuple[int, str]] = field(default_factory=set)
    functions: set[str] = field(default_factory=set)
    calls: set[int] = field(default_factory=set)  # ids of calls making distributed data

    def add(self, scope: Scope, expression) -> bool:
        """Marks what ``expression`` (read in ``scope``) is made of; whether it was new."""
        before = (len(self.names), len(self.functions), len(self.calls))
        for node in ast.walk(expression):
            if isinstance(node, ast.Name):
                self.names.add(name_in(scope, node.id))
            elif isinstance(node, ast.Call):
                self.calls.add(id(node))
                if isinstance(node.func, ast.Name):
                    self.functions.add(node.func.id)
        return before != (len(self.names), len(self.functions), len(self.calls))

    def reaches(self, scope: Scope, name: str) -> bool:
        return name_in(scope, name) in self.names


def name_in(scope: Scope, name: str) -> tuple[int, str]:
    """``name`` as read in ``scope``: the scope defining it, else this one."""
    owner = scope.lookup(name)[0]
    return id(owner if owner is not None else scope), name


def _given_data(collector: Collector, scope, call: ast.Call) -> list[ast.expr]:
    func = call.func
    if not isinstance(func, ast.Attribute):
        return []
    data = [k.value for k in call.keywords if k.arg in DATA_KEYWORDS]
    if func.attr in DISTRIBUTE_CALLS:
        return call.args[:1] + data
    owner = func.value
    if func.attr in RUN_CALLS and collector.is_strategy_value(owner, call.lineno, scope):
        return call.args[1:] + data
    if func.attr in GLOBAL_BATCH_METHODS and collector.distributed_model(owner, call.lineno):
        return call.args[:1] + data
    return []


def distributed_data(collector: Collector) -> Reach:
    reach = Reach()
    for scope in collector.scopes:
        for call in scope.calls:
            for expression in _given_data(collector, scope, call):
                reach.add(scope, expression)
    changed = True
    while changed:
        changed = False
        for scope in collector.scopes:
            for assigned in (scope.assignments, scope.unpacked):
                for name, values in list(assigned.items()):
                    if (id(scope), name) in reach.names:
                        for value in values:
                            changed |= reach.add(scope, value)
    return reach
