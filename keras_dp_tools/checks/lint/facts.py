"""One parsed file and its facts for the KDP checks (no cross-file work)."""

from __future__ import annotations

import ast
from collections import defaultdict
from functools import cached_property

from keras_dp_tools.checks.lint.collector import Collector
from keras_dp_tools.checks.lint.contracts import per_replica_contracts
from keras_dp_tools.checks.lint.intent import GLOBAL, PER_REPLICA, commented, divided_names, named
from keras_dp_tools.checks.lint.reach import callees, distributed_data, returned_data
from keras_dp_tools.checks.lint.scopes import Scope, bind, sequence_classes
from keras_dp_tools.checks.lint.windows import window_batches

MAX_ROUNDS = 8  # rounds of passing strategies and models from callers to callees


class Module:
    """One parsed file: its scopes, imports, strategies, the models they build, per-replica
    contracts, stated intent, sequence windows and the data its strategies distribute.
    ``lines``: its source lines, for the comments that state intent (read from ``path``
    when not given)."""

    def __init__(self, tree: ast.Module, path=None, lines: list[str] | None = None, project=None):
        """``project`` (a ``runner.Project``): where the project files it imports are
        found, for the strategies and models their functions return."""
        self.path = path  # a pathlib.Path for project files, None for a bare source
        self.follows_imports = project is not None
        if lines is None and path is not None:
            try:
                lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
            except OSError:
                lines = None
        self.lines = lines
        classes = sequence_classes(tree)
        self.collector = Collector(classes)  # its imports, until the first walk is done
        imported = self._imported(project, self.collector, tree)

        def walk(declined=frozenset()) -> Collector:
            collector = Collector(classes, declined=declined)
            collector.strategy_functions |= imported(
                lambda module: module.collector.strategy_functions
            )
            collector.visit(tree)
            return collector

        self.collector = first = walk()
        declined = self._declined_strategy_parameters()
        if declined:  # walked again without them, so that nothing they hold counts
            self.collector = first = walk(declined)
        received = self._propagate_strategy_arguments()
        # Again, knowing from the start the strategies the first walk found, so that a
        # function defined above the strategy it uses (or given one) sees it.
        if received or declined or first.module.strategy_names or first.class_strategy_attrs:
            self.collector = Collector(classes, first, received, declined)
            self.collector.visit(tree)
            self._propagate_strategy_arguments()
        self.model_functions: set[str] = set()  # functions returning a distributed model
        self._propagate_models(imported(lambda module: module.model_functions))
        self._tree = tree

    # Computed when first needed: a module loaded only to resolve a name never needs them.
    @cached_property
    def contracts(self):
        return per_replica_contracts(self._tree)

    @cached_property
    def divided(self) -> set[str]:
        return divided_names(self._tree)

    @cached_property
    def windows(self) -> set[int]:
        return window_batches(self.collector)

    @cached_property
    def reach(self):
        return distributed_data(self.collector)

    @cached_property
    def returned(self):
        return returned_data(self.collector)

    def makes_result(self, node, function: Scope) -> bool:
        """Whether the call ``node`` makes (part of) the result of ``function``."""
        return any(entry.sink is function.node for entry in self.returned.of_call(node))

    def _propagate_strategy_arguments(self) -> set[tuple[int, str]]:
        """A function of this file called with a strategy receives one (to a fixpoint);
        the (line of the function, parameter) pairs that do."""
        received = set()
        for _ in range(MAX_ROUNDS):
            changed = False
            for scope in self.collector.scopes:
                for call in scope.calls:
                    for callee, passed in callees(self.collector, call, nested=False):
                        for parameter, value in passed:
                            if parameter in callee.strategy_names:
                                continue
                            if self.collector.is_strategy_value(value, call.lineno, scope):
                                callee.strategy_names[parameter] = callee.node.lineno
                                callee.received = True
                                received.add((callee.node.lineno, parameter))
                                changed = True
            if not changed:
                break
        return received

    def _declined_strategy_parameters(self) -> set[tuple[int, str]]:
        """Parameters named as a strategy (``def train(strategy, ds)``) that every call of
        this file gives one that splits nothing (a ``ParameterServerStrategy``, a
        ``OneDeviceStrategy``, ``get_strategy()``, None, also as the default): (line of
        the function, parameter). A function no call of this file reaches keeps the
        name's word."""
        collector = self.collector
        given = defaultdict(list)  # (function line, parameter) -> [(caller scope, value)]
        for scope in collector.scopes:
            for call in scope.calls:
                for callee in _called(collector, call):
                    for parameter in callee.strategy_names:
                        if parameter not in callee.parameters:
                            continue
                        bound = bind(call, callee.node, parameter, bool(callee.class_name))
                        value = bound[1] if bound is not None else None
                        given[(callee.node.lineno, parameter)].append((scope, value))
        return {
            key
            for key, values in given.items()
            if all(self._splits_nothing(scope, value) for scope, value in values)
        }

    def _splits_nothing(self, scope: Scope, value, depth: int = 0) -> bool:
        """Whether ``value`` (read in ``scope``) is provably no synchronous strategy."""
        collector = self.collector
        if isinstance(value, ast.Constant) and value.value is None:
            return True
        if collector.is_other_strategy_call(value) or collector.is_default_strategy_call(value):
            return True
        if isinstance(value, ast.Name) and depth < 2:
            _, values, is_parameter = scope.lookup(value.id)
            return (
                bool(values)
                and not is_parameter
                and all(self._splits_nothing(scope, v, depth + 1) for v in values)
            )
        return False

    def _imported(self, project, collector: Collector, tree: ast.Module):
        """A function giving, for a property of modules (their functions returning a
        strategy, or a model), the names this file calls such functions of project files
        it imports by (``get_strategy``, ``common.get_strategy``)."""
        modules = []
        if project is not None and self.path is not None:
            collector.visit(ast.Module([n for n in ast.walk(tree) if _is_import(n)], []))
            for name, (level, dotted, imported) in collector.imports.items():
                found = project.load(self.path, level, dotted)
                if found is not None and found is not self:
                    modules.append((name, dotted, imported, found))

        def names(functions_of) -> set[str]:
            found = set()
            for name, dotted, imported, module in modules:
                functions = functions_of(module)
                if imported is None:
                    found |= {f"{dotted}.{function}" for function in functions}
                elif imported in functions:
                    found.add(name)
            return found

        return names

    def _propagate_models(self, imported: set[str]) -> None:
        """Models built in a function called under a strategy's scope, passed to a
        function, or returned by one (to a fixpoint)."""
        collector = self.collector
        for scope in collector.scopes:
            if scope.name in collector.scoped_functions and scope.parent is not None:
                for name, values in scope.assignments.items():
                    for value in values:
                        if isinstance(value, ast.Call):
                            collector.mark_model(ast.Name(name, ast.Load()), value.lineno, scope)
        for (_, attribute), assigned in list(collector.class_values.items()):
            for scope, value in assigned:  # self.model = build() in a scoped method
                if scope.name in collector.scoped_functions and isinstance(value, ast.Call):
                    owner = ast.Attribute(ast.Name("self", ast.Load()), attribute, ast.Load())
                    collector.mark_model(owner, value.lineno, scope)
        for _ in range(MAX_ROUNDS):
            changed = False
            self.model_functions = {
                scope.name
                for scope in collector.scopes
                if scope.name
                and any(collector.distributed_model(v, 10**9, scope) for v in scope.returns)
            }
            makers = self.model_functions | imported
            for scope in collector.scopes:
                for name, values in scope.assignments.items():
                    for value in values:
                        if isinstance(value, ast.Call) and makers & {
                            collector.qualified(value.func),
                            getattr(value.func, "id", None),
                        }:
                            changed |= collector.mark_model(
                                ast.Name(name, ast.Load()), value.lineno, scope
                            )
                for call in scope.calls:
                    for callee, passed in callees(self.collector, call, nested=False):
                        for parameter, value in passed:
                            if collector.distributed_model(value, call.lineno, scope):
                                changed |= collector.mark_model(
                                    ast.Name(parameter, ast.Load()), 0, callee
                                )
            if not changed:
                break

    def intent(self, name: str, values: list[ast.expr]) -> str | None:
        """What the code states ``name`` (given ``values``) is: GLOBAL, PER_REPLICA or None."""
        by_name = named(name)
        by_comment = {commented(self.lines, value) for value in values}
        if by_name == PER_REPLICA or PER_REPLICA in by_comment:
            return PER_REPLICA
        if by_name == GLOBAL or GLOBAL in by_comment or name in self.divided:
            return GLOBAL
        return None

    def says_global(self, name: str, values: list[ast.expr]) -> bool:
        """Whether the code states that ``name`` (given ``values``) is the global batch."""
        return self.intent(name, values) == GLOBAL

    def per_replica(self, scope: Scope) -> bool:
        """Whether ``scope`` is, or is inside, a function that is per replica by contract."""
        current = scope
        while current is not None:
            if self.contracts.covers_function(current.node):
                return True
            current = current.parent
        return False

    def any_strategy(self) -> bool:
        return any(
            scope.received or scope.creates_strategy for scope in self.collector.scopes
        ) or bool(self.collector.class_strategy_attrs)


def _called(collector: Collector, call: ast.Call) -> list[Scope]:
    """The functions of this file a call runs (``callees``), also a class's
    ``__init__`` for a constructor call."""
    found = [callee for callee, _ in callees(collector, call)]
    func = call.func
    if isinstance(func, ast.Name) and func.id in collector.classes:
        found += [
            method
            for method in collector.all_functions.get("__init__", [])
            if method.class_name == func.id
        ]
    return found


def _is_import(node) -> bool:
    return isinstance(node, (ast.Import, ast.ImportFrom))
