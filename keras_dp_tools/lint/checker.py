"""The KDP checks on one Python source.

KDP001: a batch size given to ``.batch(X)`` or ``batch_size=X`` in a scope where a
distribution strategy is created or received, where ``X`` is a constant: not derived from
``num_replicas_in_sync`` (directly, through simple assignments, ``kdt.scale_batch_size``,
``input_context.get_per_replica_batch_size`` or a ``kdt.plan_scaling`` plan). Values whose
origin cannot be followed (parameters, attributes, calls) are not flagged.

KDP002 (info): a constant learning rate given to an optimizer in a module whose batch
*is* scaled by the replica count: the rate was probably tuned for another batch.

Scopes are the module and each function. A function is a strategy scope when it creates
a strategy (``tf.distribute.MirroredStrategy()``, ``MultiWorkerMirroredStrategy``,
``get_strategy()``, ``kdt.mirrored_strategy()``, under any import alias), receives one (a
parameter named ``strategy``, annotated as a ``Strategy``, passed a strategy at a call
in the same module, or any name used as ``with <name>.scope():``), uses ``self.<attr>``
set to a strategy in its class, or is nested in a strategy scope. Module-level code that
creates a strategy makes every function of the module a strategy scope.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass

CODES = {
    "KDP001": "batch size not scaled by strategy.num_replicas_in_sync",
    "KDP002": "learning rate not scaled while the batch is",
    "KDP900": "syntax error: file not checked",
}
_STRATEGY_CLASSES = {
    "MirroredStrategy",
    "MultiWorkerMirroredStrategy",
    "CollectiveAllReduceStrategy",
    "TPUStrategy",
    "CentralStorageStrategy",
    "get_strategy",
}
_STRATEGY_HELPERS = {"keras_dp_tools.mirrored_strategy", "keras_dp_tools.devices.mirrored_strategy"}
_STRATEGY_PARAMETERS = {"strategy", "distribution_strategy", "dist_strategy", "strat"}
# Calls whose result is already per replica or scaled by the replica count.
_SCALED_CALLS = {
    "scale_batch_size",
    "get_per_replica_batch_size",
    "scale_learning_rate",
    "plan_scaling",
    "warmup_schedule",
}
# Calls that keep the provenance of their arguments.
_TRANSPARENT_CALLS = {"int", "round", "max", "min", "float", "abs"}
_OPTIMIZERS = {
    "SGD",
    "Adam",
    "AdamW",
    "Adamax",
    "Nadam",
    "RMSprop",
    "Adagrad",
    "Adadelta",
    "Adafactor",
    "Ftrl",
    "Lion",
    "Lamb",
    "LAMB",
}
SCALED, CONSTANT, UNKNOWN = "scaled", "constant", "unknown"


@dataclass(frozen=True, order=True)
class Violation:
    """One finding: 1-based ``line``, 0-based ``col`` (as flake8 reports them)."""

    line: int
    col: int
    code: str
    message: str

    def format(self, path: str) -> str:
        return f"{path}:{self.line}:{self.col + 1}: {self.code} {self.message}"


def _combine(kinds) -> str:
    kinds = set(kinds)
    if SCALED in kinds:
        return SCALED
    if UNKNOWN in kinds or not kinds:
        return UNKNOWN
    return CONSTANT


class _Scope:
    def __init__(self, node, parent: _Scope | None, class_name: str | None = None):
        self.node = node
        self.parent = parent
        self.class_name = class_name
        self.assignments: dict[str, list[ast.expr]] = defaultdict(list)
        self.parameters: list[str] = []
        self.strategy_names: set[str] = set()
        self.creates_strategy = False
        self.uses_self_attrs: set[str] = set()
        self.batch_sizes: list[ast.expr] = []  # values given as batch sizes
        self.learning_rates: list[ast.expr] = []  # values given to optimizers
        self.calls: list[ast.Call] = []
        self.received = False

    def lookup(self, name: str) -> tuple[_Scope | None, list[ast.expr]]:
        scope = self
        while scope is not None:
            if name in scope.parameters:
                return scope, []
            if name in scope.assignments:
                return scope, scope.assignments[name]
            scope = scope.parent
        return None, []


class _Collector(ast.NodeVisitor):
    """Walks a module once, building scopes and the import aliases."""

    def __init__(self):
        self.aliases: dict[str, str] = {}
        self.module = _Scope(None, None)
        self.scopes: list[_Scope] = [self.module]
        self.functions: dict[str, _Scope] = {}
        self.class_strategy_attrs: dict[str, set[str]] = defaultdict(set)
        self._stack = [self.module]
        self._class: list[str] = []

    @property
    def scope(self) -> _Scope:
        return self._stack[-1]

    # -- names -----------------------------------------------------------------

    def visit_Import(self, node):
        for alias in node.names:
            if alias.asname:
                self.aliases[alias.asname] = alias.name
            else:
                top = alias.name.split(".")[0]
                self.aliases[top] = top

    def visit_ImportFrom(self, node):
        for alias in node.names:
            self.aliases[alias.asname or alias.name] = f"{node.module or ''}.{alias.name}"

    def qualified(self, node) -> str | None:
        if isinstance(node, ast.Name):
            name = self.aliases.get(node.id, node.id)
        elif isinstance(node, ast.Attribute):
            base = self.qualified(node.value)
            if base is None:
                return None
            name = f"{base}.{node.attr}"
        else:
            return None
        return "tensorflow" + name[2:] if name == "tf" or name.startswith("tf.") else name

    def is_strategy_call(self, node) -> bool:
        if not isinstance(node, ast.Call):
            return False
        name = self.qualified(node.func) or ""
        if name in _STRATEGY_HELPERS or name.endswith(".mirrored_strategy"):
            return True
        parts = name.split(".")
        return parts[-1] in _STRATEGY_CLASSES and "distribute" in parts[:-1]

    # -- scopes ------------------------------------------------------------------

    def visit_ClassDef(self, node):
        self._class.append(node.name)
        self.generic_visit(node)
        self._class.pop()

    def visit_FunctionDef(self, node):
        scope = _Scope(node, self.scope, self._class[-1] if self._class else None)
        arguments = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
        scope.parameters = [argument.arg for argument in arguments]
        for argument in arguments:
            annotation = ast.unparse(argument.annotation) if argument.annotation else ""
            if argument.arg in _STRATEGY_PARAMETERS or annotation.endswith("Strategy"):
                scope.strategy_names.add(argument.arg)
                scope.received = True
        self.scopes.append(scope)
        if self.scope is self.module:
            self.functions[node.name] = scope
        self._stack.append(scope)
        for statement in node.body:
            self.visit(statement)
        self._stack.pop()
        for default in [*node.args.defaults, *node.args.kw_defaults]:
            if default is not None:
                self.visit(default)

    visit_AsyncFunctionDef = visit_FunctionDef

    # -- facts -------------------------------------------------------------------

    def _assign(self, target, value):
        if isinstance(target, ast.Name):
            self.scope.assignments[target.id].append(value)
            if self.is_strategy_call(value) or (
                isinstance(value, ast.Name) and value.id in self.scope.strategy_names
            ):
                self.scope.strategy_names.add(target.id)
                self.scope.creates_strategy = True
        elif (
            isinstance(target, ast.Attribute)
            and isinstance(target.value, ast.Name)
            and target.value.id == "self"
            and self._class
            and self.is_strategy_call(value)
        ):
            self.class_strategy_attrs[self._class[-1]].add(target.attr)
            self.scope.creates_strategy = True

    def visit_Assign(self, node):
        for target in node.targets:
            self._assign(target, node.value)
        self.generic_visit(node)

    def visit_AnnAssign(self, node):
        if node.value is not None:
            self._assign(node.target, node.value)
        self.generic_visit(node)

    def visit_AugAssign(self, node):
        if isinstance(node.target, ast.Name):
            combined = ast.BinOp(
                left=ast.Name(node.target.id, ast.Load()), op=node.op, right=node.value
            )
            self.scope.assignments[node.target.id].append(combined)
        self.generic_visit(node)

    def visit_With(self, node):
        for item in node.items:  # "with dist.scope():" says dist is a strategy
            call = item.context_expr
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr == "scope"
                and isinstance(call.func.value, ast.Name)
            ):
                self.scope.strategy_names.add(call.func.value.id)
                self.scope.received = True
        self.generic_visit(node)

    def visit_Attribute(self, node):
        if isinstance(node.value, ast.Name) and node.value.id == "self":
            self.scope.uses_self_attrs.add(node.attr)
        self.generic_visit(node)

    def visit_Call(self, node):
        if self.is_strategy_call(node):
            self.scope.creates_strategy = True
        self.scope.calls.append(node)
        func = node.func
        size = _keyword(node, "batch_size")
        if isinstance(func, ast.Attribute) and func.attr == "batch" and node.args:
            size = node.args[0]
        if size is not None:
            self.scope.batch_sizes.append(size)
        name = (self.qualified(func) or "").split(".")[-1]
        if name in _OPTIMIZERS:
            rate = _keyword(node, "learning_rate") or _keyword(node, "lr")
            rate = rate if rate is not None else (node.args[0] if node.args else None)
            if rate is not None:
                self.scope.learning_rates.append(rate)
        self.generic_visit(node)


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((keyword.value for keyword in call.keywords if keyword.arg == name), None)


class _Analysis:
    def __init__(self, tree: ast.Module):
        self.collector = _Collector()
        self.collector.visit(tree)
        self._propagate_strategy_arguments()

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
                            and self._is_strategy_value(scope, value)
                        ):
                            callee.strategy_names.add(parameter)
                            callee.received = True
                            changed = True

    def _is_strategy_value(self, scope: _Scope, value) -> bool:
        if self.collector.is_strategy_call(value):
            return True
        if isinstance(value, ast.Name):
            current = scope
            while current is not None:
                if value.id in current.strategy_names:
                    return True
                current = current.parent
        return False

    def is_strategy_scope(self, scope: _Scope) -> bool:
        current = scope
        while current is not None:
            if current.creates_strategy or current.received:
                return True
            attrs = self.collector.class_strategy_attrs.get(current.class_name or "", set())
            if attrs & current.uses_self_attrs:
                return True
            current = current.parent
        return False

    def provenance(self, scope: _Scope, node, seen=frozenset()) -> str:
        """``scaled``, ``constant`` or ``unknown``: where a value comes from."""
        if isinstance(node, ast.Constant):
            return CONSTANT if isinstance(node.value, (int, float)) else UNKNOWN
        if isinstance(node, ast.Attribute):
            if node.attr in ("num_replicas_in_sync", "global_batch", "target_lr"):
                if node.attr == "num_replicas_in_sync":
                    return SCALED
                return self.provenance(scope, node.value, seen)  # a plan's fields
            return UNKNOWN
        if isinstance(node, ast.Name):
            if node.id in seen:
                return UNKNOWN
            owner, values = scope.lookup(node.id)
            if owner is None or not values:
                return UNKNOWN
            return _combine(self.provenance(owner, value, seen | {node.id}) for value in values)
        if isinstance(node, ast.Call):
            name = (self.collector.qualified(node.func) or "").split(".")[-1]
            if isinstance(node.func, ast.Attribute) and node.func.attr in _SCALED_CALLS:
                return SCALED
            if name in _SCALED_CALLS:
                return SCALED
            if name in _TRANSPARENT_CALLS:
                return _combine(self.provenance(scope, arg, seen) for arg in node.args)
            return UNKNOWN
        if isinstance(node, ast.BinOp):
            return _combine(
                [self.provenance(scope, node.left, seen), self.provenance(scope, node.right, seen)]
            )
        if isinstance(node, ast.UnaryOp):
            return self.provenance(scope, node.operand, seen)
        if isinstance(node, ast.IfExp):
            return _combine(
                [self.provenance(scope, node.body, seen), self.provenance(scope, node.orelse, seen)]
            )
        return UNKNOWN

    def violations(self) -> list[Violation]:
        found = []
        any_scaled_batch = False
        for scope in self.collector.scopes:
            for size in scope.batch_sizes:
                any_scaled_batch |= self.provenance(scope, size) == SCALED
        strategy_anywhere = any(self.is_strategy_scope(s) for s in self.collector.scopes)
        for scope in self.collector.scopes:
            if not self.is_strategy_scope(scope):
                continue
            for size in scope.batch_sizes:
                if self.provenance(scope, size) == CONSTANT:
                    shown = ast.unparse(size)
                    found.append(
                        Violation(
                            size.lineno,
                            size.col_offset,
                            "KDP001",
                            f"batch size {shown} is not scaled by the replica count: under a "
                            f"strategy it is the global batch, split over replicas. Use "
                            f"{shown} * strategy.num_replicas_in_sync "
                            "(kdt.scale_batch_size) if it is meant per replica.",
                        )
                    )
        if any_scaled_batch and strategy_anywhere:
            for scope in self.collector.scopes:
                for rate in scope.learning_rates:
                    if self.provenance(scope, rate) == CONSTANT:
                        found.append(
                            Violation(
                                rate.lineno,
                                rate.col_offset,
                                "KDP002",
                                f"learning rate {ast.unparse(rate)} is a constant while the "
                                "batch grows with the replica count: consider "
                                "kdt.scale_learning_rate (linear or sqrt rule) with a "
                                "warm-up (kdt.warmup_schedule).",
                            )
                        )
        return sorted(found)


def check_source(source: str, filename: str = "<source>") -> list[Violation]:
    """KDP violations in Python ``source``; a syntax error is one ``KDP900`` violation."""
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as error:
        return [
            Violation(
                error.lineno or 1,
                max((error.offset or 1) - 1, 0),
                "KDP900",
                f"syntax error, file not checked: {error.msg}",
            )
        ]
    return _Analysis(tree).violations()


def check_tree(tree: ast.Module) -> list[Violation]:
    """``check_source`` on an already parsed module (the flake8 plugin's entry)."""
    return _Analysis(tree).violations()
