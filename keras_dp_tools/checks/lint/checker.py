"""The KDP checks on one Python source (and, given a project, the files it imports).

KDP001 (error): a batch size given to ``.batch(X)``/``.padded_batch(X)`` or ``batch_size=X``
(other than to ``fit``/``evaluate``/``predict``) in a scope where a distribution strategy
is created or received, where ``X`` is a constant: not derived from
``num_replicas_in_sync`` (directly, through simple assignments, ``kdt.scale_batch_size``,
``input_context.get_per_replica_batch_size`` or a ``kdt.plan_scaling`` plan).

KDP003 (warning): the same for ``model.fit/evaluate/predict(batch_size=X)``. Keras
documents that argument as the global batch, so a constant there may be deliberate: the
message says what each reading implies, and the code can be silenced on its own.

Both follow values through calls: a constant (a literal, a module constant, a parameter
default) that reaches a helper's batch size, in this file or in a project file it imports
(``import data``, ``from .data import f``, ``from pkg.data import f``), is reported at the
call where it enters, naming the ``batch(...)`` it reaches, when a strategy is in scope at
that call or anywhere on the way. Calls are followed ``MAX_CALL_DEPTH`` deep; recursion
stops. Values whose origin cannot be followed (parameters nobody binds to a constant,
attributes, calls) are not flagged.

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
from collections.abc import Callable
from dataclasses import dataclass, replace

from keras_dp_tools.common.findings import Finding
from keras_dp_tools.common.severity import Severity

CODES = {
    "KDP001": "batch size not scaled by strategy.num_replicas_in_sync",
    "KDP002": "learning rate not scaled while the batch is",
    "KDP003": "constant fit/evaluate/predict batch_size under a strategy (global: maybe meant)",
    "KDP900": "syntax error: file not checked",
}
SEVERITIES = {
    "KDP001": Severity.ERROR,
    "KDP002": Severity.INFO,
    "KDP003": Severity.WARNING,
    "KDP900": Severity.ERROR,
}
MAX_CALL_DEPTH = 4  # calls followed from a call site down to a batch(...)
MAX_IMPORT_DEPTH = 4  # re-exports followed to find a name's definition
_STRATEGY_CLASSES = {
    "MirroredStrategy",
    "MultiWorkerMirroredStrategy",
    "CollectiveAllReduceStrategy",
    "TPUStrategy",
    "CentralStorageStrategy",
    "get_strategy",
}
_STRATEGY_HELPERS = {
    "keras_dp_tools.mirrored_strategy",
    "keras_dp_tools.setup.devices.mirrored_strategy",
}
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
_BATCHING_METHODS = {"batch", "padded_batch"}
# Keras methods whose batch_size is documented as the global batch (KDP003).
_GLOBAL_BATCH_METHODS = {"fit", "evaluate", "predict"}
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
# Where a value comes from. PARAMETER: constants and the enclosing function's parameters.
SCALED, CONSTANT, UNKNOWN, PARAMETER = "scaled", "constant", "unknown", "parameter"


@dataclass(frozen=True)
class Related:
    """Another place a finding involves: ``path`` None means the same file."""

    path: str | None
    line: int
    col: int
    note: str


def Violation(line: int, col: int, code: str, message: str, related=()) -> Finding:
    """A lint finding (``kdt.LintViolation``): a ``Finding`` at 1-based ``line``, 0-based
    ``col`` (as flake8 reports them), with the code's severity (``SEVERITIES``);
    ``related`` the other places it involves (the ``batch(...)`` a value reaches).
    ``violation.format(path)`` is flake8's line; findings sort by place."""
    return Finding(SEVERITIES[code], code, message, line=line, col=col, related=related)


@dataclass(frozen=True)
class _Flow:
    kind: str
    params: frozenset = frozenset()  # (scope, name) pairs, for PARAMETER


def _combine(flows) -> _Flow:
    flows = list(flows)
    kinds = {flow.kind for flow in flows}
    if SCALED in kinds:
        return _Flow(SCALED)
    if UNKNOWN in kinds or not flows:
        return _Flow(UNKNOWN)
    params = frozenset().union(*(flow.params for flow in flows))
    return _Flow(PARAMETER, params) if params else _Flow(CONSTANT)


@dataclass(frozen=True)
class _Site:
    """A batch size given at a call: ``size`` the value, ``code`` KDP001 or KDP003."""

    size: ast.expr
    call: ast.Call
    code: str

    def text(self) -> str:
        func = self.call.func
        name = f".{func.attr}" if isinstance(func, ast.Attribute) else ast.unparse(func)
        size = ast.unparse(self.size)
        return f"{name}({size})" if self.size in self.call.args else f"{name}(batch_size={size})"


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
        self.batch_sites: list[_Site] = []
        self.learning_rates: list[ast.expr] = []  # values given to optimizers
        self.calls: list[ast.Call] = []
        self.received = False

    def lookup(self, name: str) -> tuple[_Scope | None, list[ast.expr], bool]:
        """The scope defining ``name``, its assigned values, and whether it is a parameter."""
        scope = self
        while scope is not None:
            if name in scope.parameters or name in scope.assignments:
                return scope, scope.assignments.get(name, []), name in scope.parameters
            scope = scope.parent
        return None, [], False

    def within(self, other: _Scope) -> bool:
        scope = self
        while scope is not None and scope is not other:
            scope = scope.parent
        return scope is other


class _Collector(ast.NodeVisitor):
    """Walks a module once, building scopes and the import aliases."""

    def __init__(self):
        self.aliases: dict[str, str] = {}
        # local name -> (level, module, imported name or None): for following imports.
        self.imports: dict[str, tuple[int, str, str | None]] = {}
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
                self.imports[alias.asname] = (0, alias.name, None)
            else:
                top = alias.name.split(".")[0]
                self.aliases[top] = top
                self.imports[top] = (0, top, None)

    def visit_ImportFrom(self, node):
        for alias in node.names:
            self.aliases[alias.asname or alias.name] = f"{node.module or ''}.{alias.name}"
            self.imports[alias.asname or alias.name] = (node.level, node.module or "", alias.name)

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
        arguments = _arguments(node)
        scope.parameters = [argument.arg for argument in arguments]
        for argument in arguments:
            annotation = ast.unparse(argument.annotation) if argument.annotation else ""
            if argument.arg in _STRATEGY_PARAMETERS or annotation.endswith("Strategy"):
                scope.strategy_names.add(argument.arg)
                scope.received = True
        self.scopes.append(scope)
        if self.scope is self.module and not self._class:
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
        size, code = _keyword(node, "batch_size"), "KDP001"
        if isinstance(func, ast.Attribute) and func.attr in _BATCHING_METHODS and node.args:
            size = node.args[0]
        elif isinstance(func, ast.Attribute) and func.attr in _GLOBAL_BATCH_METHODS:
            code = "KDP003"
        if size is not None:
            self.scope.batch_sites.append(_Site(size, node, code))
        name = (self.qualified(func) or "").split(".")[-1]
        if name in _OPTIMIZERS:
            rate = _keyword(node, "learning_rate") or _keyword(node, "lr")
            rate = rate if rate is not None else (node.args[0] if node.args else None)
            if rate is not None:
                self.scope.learning_rates.append(rate)
        self.generic_visit(node)


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((keyword.value for keyword in call.keywords if keyword.arg == name), None)


class Module:
    """One parsed file: its scopes, imports and strategy facts (no cross-file work)."""

    def __init__(self, tree: ast.Module, path=None):
        self.path = path  # a pathlib.Path for project files, None for a bare source
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


@dataclass(frozen=True)
class _Place:
    module: Module
    line: int
    col: int
    text: str


def _place(module: Module, node, text: str) -> _Place:
    return _Place(module, node.lineno, node.col_offset, text)


@dataclass(frozen=True)
class _Sink:
    """A batch size inside a function that is constant once ``params`` (names of that
    function's parameters) are: what a call to the function can make constant."""

    params: frozenset
    code: str
    batch: _Place  # the batch(...) it reaches
    shown: str  # the constant, for sinks already constant inside the function
    size: str  # the batch size as written at the batch(...)
    through: tuple[_Place, ...] = ()  # calls from the function down to the batch
    in_strategy: bool = False  # a strategy is in scope somewhere on the way
    reported: bool = False  # already flagged where the constant entered


class _Binding:
    """What a call passes for a sink's parameters."""

    def __init__(self):
        self.flows: list[_Flow] = []
        self.arguments: list[ast.expr] = []  # call arguments that carry values
        self.defaults: list[_Place] = []  # callee defaults that carry values


def _bind(call: ast.Call, function, name: str) -> tuple[str, ast.expr] | None:
    """Which of the call's arguments (``"argument"``) or of the function's defaults
    (``"default"``) gives parameter ``name``; None when splats make it unknowable."""
    for keyword in call.keywords:
        if keyword.arg == name:
            return "argument", keyword.value
    arguments = function.args
    positional = [argument.arg for argument in [*arguments.posonlyargs, *arguments.args]]
    splat = any(isinstance(arg, ast.Starred) for arg in call.args) or any(
        keyword.arg is None for keyword in call.keywords
    )
    if name in positional:
        index = positional.index(name)
        before = call.args[: index + 1]
        if index < len(call.args) and not any(isinstance(arg, ast.Starred) for arg in before):
            return "argument", call.args[index]
        if splat:
            return None
        offset = index - (len(positional) - len(arguments.defaults))
        return ("default", arguments.defaults[offset]) if offset >= 0 else None
    kwonly = [argument.arg for argument in arguments.kwonlyargs]
    if name in kwonly and not splat:
        default = arguments.kw_defaults[kwonly.index(name)]
        return ("default", default) if default is not None else None
    return None


class Checker:
    """The checks for one module; ``project`` (a ``runner.Project``) resolves imports
    to other files, ``label`` names a line of this module in messages."""

    def __init__(self, module: Module, project=None, label: Callable[[int], str] | None = None):
        self.module = module
        self.project = project
        self.label = label or (lambda line: f"line {line}")
        self._summaries: dict = {}
        self._active: set = set()

    # -- names across files ------------------------------------------------------

    def _load(self, module: Module, level: int, dotted: str) -> Module | None:
        if self.project is None or module.path is None:
            return None
        return self.project.load(module.path, level, dotted)

    def resolve_name(self, module: Module, name: str, depth: int = 0):
        """``("function", module, scope)``, ``("constant", module, name)`` or
        ``("module", module)`` for a module-level name; None when not followed."""
        collector = module.collector
        if depth > MAX_IMPORT_DEPTH:
            return None
        if name in collector.functions:
            return "function", module, collector.functions[name]
        if name in collector.module.assignments:
            return "constant", module, name
        if name not in collector.imports:
            return None
        level, dotted, imported = collector.imports[name]
        if imported is None:
            found = self._load(module, level, dotted)
            return ("module", found) if found is not None else None
        submodule = self._load(module, level, f"{dotted}.{imported}" if dotted else imported)
        if submodule is not None:
            return "module", submodule
        source = self._load(module, level, dotted)
        return self.resolve_name(source, imported, depth + 1) if source is not None else None

    def resolve(self, module: Module, node, depth: int = 0):
        """``resolve_name`` for a name or a dotted attribute of an imported module."""
        if isinstance(node, ast.Name):
            return self.resolve_name(module, node.id, depth)
        if isinstance(node, ast.Attribute):
            base = self.resolve(module, node.value, depth)
            if base is not None and base[0] == "module":
                package = base[1]
                if package.path.name == "__init__.py":  # pkg.data: a submodule first
                    submodule = self.project.load(package.path, 1, node.attr)
                    if submodule is not None:
                        return "module", submodule
                return self.resolve_name(package, node.attr, depth + 1)
        return None

    # -- where values come from ----------------------------------------------------

    def flow(self, module: Module, scope: _Scope, node, seen=frozenset()) -> _Flow:
        """Where a value comes from: scaled, constant, unknown, or parameters."""
        if isinstance(node, ast.Constant):
            return _Flow(CONSTANT if isinstance(node.value, (int, float)) else UNKNOWN)
        if isinstance(node, ast.Attribute):
            if node.attr == "num_replicas_in_sync":
                return _Flow(SCALED)
            if node.attr in ("global_batch", "target_lr"):  # a plan's fields
                return self.flow(module, scope, node.value, seen)
            return self._imported_flow(module, node, seen)
        if isinstance(node, ast.Name):
            if (id(module), node.id) in seen:
                return _Flow(UNKNOWN)
            owner, values, is_parameter = scope.lookup(node.id)
            if owner is None:
                return self._imported_flow(module, node, seen)
            seen = seen | {(id(module), node.id)}
            flows = [self.flow(module, owner, value, seen) for value in values]
            if is_parameter:
                flows.append(_Flow(PARAMETER, frozenset({(owner, node.id)})))
            return _combine(flows)
        if isinstance(node, ast.Call):
            name = (module.collector.qualified(node.func) or "").split(".")[-1]
            if isinstance(node.func, ast.Attribute) and node.func.attr in _SCALED_CALLS:
                return _Flow(SCALED)
            if name in _SCALED_CALLS:
                return _Flow(SCALED)
            if name in _TRANSPARENT_CALLS:
                return _combine(self.flow(module, scope, arg, seen) for arg in node.args)
            return _Flow(UNKNOWN)
        if isinstance(node, ast.BinOp):
            return _combine(
                [self.flow(module, scope, side, seen) for side in (node.left, node.right)]
            )
        if isinstance(node, ast.UnaryOp):
            return self.flow(module, scope, node.operand, seen)
        if isinstance(node, ast.IfExp):
            return _combine(
                [self.flow(module, scope, side, seen) for side in (node.body, node.orelse)]
            )
        return _Flow(UNKNOWN)

    def _imported_flow(self, module: Module, node, seen) -> _Flow:
        """A module constant of another project file (``from config import BATCH``)."""
        found = self.resolve(module, node) if self.project is not None else None
        if found is None or found[0] != "constant":
            return _Flow(UNKNOWN)
        _, owner, name = found
        return self.flow(owner, owner.collector.module, ast.Name(name, ast.Load()), seen)

    # -- through calls -----------------------------------------------------------------

    def callee(self, module: Module, call: ast.Call) -> tuple[Module, _Scope] | None:
        if isinstance(call.func, ast.Name) and call.func.id in module.collector.functions:
            return module, module.collector.functions[call.func.id]
        if self.project is None:
            return None
        found = self.resolve(module, call.func)
        return (found[1], found[2]) if found is not None and found[0] == "function" else None

    def through_call(self, module: Module, scope: _Scope, call: ast.Call, budget: int):
        """``(sink, binding)`` for each batch size of the called function that this
        call's arguments (or the function's defaults) decide."""
        target = self.callee(module, call)
        if target is None:
            return
        callee_module, callee = target
        for sink in self.summary(callee_module, callee, budget):
            binding = _Binding()
            order = [argument.arg for argument in _arguments(callee.node)]
            for name in sorted(sink.params, key=order.index):
                bound = _bind(call, callee.node, name)
                if bound is None:
                    binding.flows.append(_Flow(UNKNOWN))
                elif bound[0] == "argument":
                    binding.flows.append(self.flow(module, scope, bound[1]))
                    binding.arguments.append(bound[1])
                else:
                    default = bound[1]
                    binding.flows.append(self.flow(callee_module, callee.parent, default))
                    binding.defaults.append(
                        _place(callee_module, default, f"{name}={ast.unparse(default)}")
                    )
            yield sink, binding

    def summary(self, module: Module, function: _Scope, budget: int) -> list[_Sink]:
        """The sinks of ``function``: batch sizes made constant by its parameters, or
        already constant inside it (recursion and depth bounded)."""
        key = (id(module), id(function), budget)
        if key in self._summaries:
            return self._summaries[key]
        if budget <= 0 or (id(module), id(function)) in self._active:
            return []
        self._active.add((id(module), id(function)))
        sinks = []
        for scope in module.collector.scopes:
            if not scope.within(function):
                continue
            strategy = module.is_strategy_scope(scope)
            for site in scope.batch_sites:
                flow = self.flow(module, scope, site.size)
                batch = _place(module, site.size, site.text())  # on the batch(...) line
                size = ast.unparse(site.size)
                if flow.kind == CONSTANT:
                    sinks.append(
                        _Sink(
                            frozenset(),
                            site.code,
                            batch,
                            shown=size,
                            size=size,
                            in_strategy=strategy,
                            reported=strategy,
                        )
                    )
                elif flow.kind == PARAMETER and all(owner is function for owner, _ in flow.params):
                    names = frozenset(name for _, name in flow.params)
                    sinks.append(
                        _Sink(names, site.code, batch, shown="", size=size, in_strategy=strategy)
                    )
            for call in scope.calls:
                here = _place(module, call, f"{ast.unparse(call.func)}()")
                for sink, binding in self.through_call(module, scope, call, budget - 1):
                    flow = _combine(binding.flows) if sink.params else _Flow(CONSTANT)
                    on_way = sink.in_strategy or strategy
                    through = (here, *sink.through)
                    if flow.kind == CONSTANT:
                        shown = _shown(sink, binding)
                        sinks.append(
                            replace(
                                sink,
                                params=frozenset(),
                                shown=shown,
                                through=through,
                                in_strategy=on_way,
                                reported=sink.reported or on_way,
                            )
                        )
                    elif flow.kind == PARAMETER and all(
                        owner is function for owner, _ in flow.params
                    ):
                        names = frozenset(name for _, name in flow.params)
                        sinks.append(
                            replace(sink, params=names, through=through, in_strategy=on_way)
                        )
        self._active.discard((id(module), id(function)))
        self._summaries[key] = sinks
        return sinks

    # -- findings ---------------------------------------------------------------------

    def where(self, place: _Place) -> str:
        if place.module is self.module:
            return self.label(place.line)
        return f"{self.project.display(place.module.path)}:{place.line}"

    def related(self, place: _Place, note: str) -> Related:
        path = None if place.module is self.module else self.project.display(place.module.path)
        return Related(path, place.line, place.col, note)

    def violations(self) -> list[Violation]:
        module = self.module
        scopes = module.collector.scopes
        found = []
        for scope in scopes:
            strategy = module.is_strategy_scope(scope)
            for site in scope.batch_sites if strategy else ():
                if self.flow(module, scope, site.size).kind == CONSTANT:
                    found.append(_local_violation(site))
            for call in scope.calls:
                found += self._call_violations(scope, call, strategy)
        found += self._learning_rate_violations()
        unique = {(v.line, v.col, v.code, v.message): v for v in found}
        return sorted(unique.values())

    def _call_violations(self, scope: _Scope, call: ast.Call, strategy: bool) -> list[Violation]:
        found = []
        for sink, binding in self.through_call(self.module, scope, call, MAX_CALL_DEPTH):
            if sink.reported or not (strategy or sink.in_strategy):
                continue
            if sink.params and _combine(binding.flows).kind != CONSTANT:
                continue
            shown = _shown(sink, binding)
            callee = f"{ast.unparse(call.func)}()"
            at = self.label(call.lineno)
            reaches = f"{sink.batch.text} at {self.where(sink.batch)}"
            if sink.through:
                reaches += (
                    " (through "
                    + ", ".join(f"{step.text} at {self.where(step)}" for step in sink.through)
                    + ")"
                )
            related = [self.related(sink.batch, "the batch size is used here")]
            related += [self.related(step, "called here") for step in sink.through]
            if binding.arguments:
                anchor = binding.arguments[0]
                values = ", ".join(ast.unparse(argument) for argument in binding.arguments)
                opening = f"batch size {values} passed to {callee} at {at} reaches {reaches}"
                if len(binding.flows) > 1:
                    opening = f"{values} passed to {callee} at {at} make {reaches} constant"
            elif binding.defaults:
                anchor = call
                default = binding.defaults[0]
                opening = (
                    f"{callee} at {at} leaves {default.text} (its default, "
                    f"{self.where(default)}), which reaches {reaches}"
                )
                related.append(self.related(default, "the default is set here"))
            else:
                anchor = call
                opening = f"{callee} at {at} runs {reaches} with the constant batch size {shown}"
            found.append(
                Violation(
                    anchor.lineno,
                    anchor.col_offset,
                    sink.code,
                    f"{opening}; {_reading(sink.code, shown)}",
                    tuple(related),
                )
            )
        return found

    def _learning_rate_violations(self) -> list[Violation]:
        module = self.module
        scopes = module.collector.scopes
        any_scaled_batch = any(
            self.flow(module, scope, site.size).kind == SCALED
            for scope in scopes
            for site in scope.batch_sites
        )
        if not any_scaled_batch or not any(module.is_strategy_scope(s) for s in scopes):
            return []
        return [
            Violation(
                rate.lineno,
                rate.col_offset,
                "KDP002",
                f"learning rate {ast.unparse(rate)} is a constant while the "
                "batch grows with the replica count: consider "
                "kdt.scale_learning_rate (linear or sqrt rule) with a "
                "warm-up (kdt.warmup_schedule).",
            )
            for scope in scopes
            for rate in scope.learning_rates
            if self.flow(module, scope, rate).kind == CONSTANT
        ]


def _arguments(function) -> list[ast.arg]:
    arguments = function.args
    return [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]


def _shown(sink: _Sink, binding: _Binding) -> str:
    """The constant as the user wrote it; with several, the batch size expression."""
    if not sink.params:
        return sink.shown
    values = [ast.unparse(argument) for argument in binding.arguments]
    values += [default.text.split("=", 1)[1] for default in binding.defaults]
    return values[0] if len(values) == 1 else f"({sink.size})"


def _reading(code: str, shown: str) -> str:
    """What the constant means under a strategy, and the fix for each intent."""
    scaled = f"{shown} * strategy.num_replicas_in_sync"
    if code == "KDP003":
        return (
            f"Keras reads batch_size as the global batch: on n replicas each gets {shown} / n "
            f"examples per step. If {shown} is meant per replica, pass {scaled} "
            "(kdt.scale_batch_size); if it is meant as the global batch, keep it and silence "
            "this line with '# noqa: KDP003'."
        )
    return (
        "it is not scaled by the replica count: under a strategy it is the global batch, "
        f"split over replicas. Use {scaled} (kdt.scale_batch_size) if it is meant per replica."
    )


def _local_violation(site: _Site) -> Violation:
    shown = ast.unparse(site.size)
    if site.code == "KDP003":
        message = f"{site.text()} is a constant under a strategy; {_reading('KDP003', shown)}"
    else:
        message = (
            f"batch size {shown} is not scaled by the replica count: under a strategy it is "
            f"the global batch, split over replicas. Use {shown} * "
            "strategy.num_replicas_in_sync (kdt.scale_batch_size) if it is meant per replica."
        )
    return Violation(site.size.lineno, site.size.col_offset, site.code, message)


def _syntax_violation(error: SyntaxError) -> Violation:
    return Violation(
        error.lineno or 1,
        max((error.offset or 1) - 1, 0),
        "KDP900",
        f"syntax error, file not checked: {error.msg}",
    )


def check_source(
    source: str, filename: str = "<source>", project=None, label=None
) -> list[Violation]:
    """KDP violations in Python ``source``; a syntax error is one ``KDP900`` violation.

    With a ``project`` (``keras_dp_tools.checks.lint.runner.Project``) and a real ``filename``,
    imports of project files are followed; ``label`` names a line in messages
    (default ``"line N"``).
    """
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as error:
        return [_syntax_violation(error)]
    return check_tree(tree, filename if project is not None else None, project, label)


def check_tree(tree: ast.Module, filename=None, project=None, label=None) -> list[Violation]:
    """``check_source`` on an already parsed module (the flake8 plugin's entry)."""
    module = project.register(filename, tree) if project is not None and filename else None
    return Checker(module or Module(tree), project, label).violations()
