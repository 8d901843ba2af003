"""The KDP checks on one Python source (and, given a project, the files it imports).

KDP001 (error): a batch size given to ``.batch(X)`` (``padded_batch``, ``ragged_batch``,
``dense_to_ragged_batch``, ``bucket_by_sequence_length``'s sizes, a ``keras.utils.Sequence``
or ``PyDataset`` subclass's constructor) or ``batch_size=X`` (other than to
``fit``/``evaluate``/``predict``), where ``X`` is a constant (not derived from
``num_replicas_in_sync`` directly, through simple assignments, ``kdt.scale_batch_size``,
an input context or a ``kdt.plan_scaling`` plan) and a strategy splits the batch.

KDP003 (warning): the same for ``model.fit/evaluate/predict(batch_size=X)``. Keras
documents that argument as the global batch, so a constant there may be deliberate: the
message says what each reading implies, and the code can be silenced on its own.

A strategy splits a batch when the batch reaches what it distributes (``reach.py``: the
``fit``/``evaluate``/``predict`` of a model built under ``strategy.scope()``,
``experimental_distribute_dataset``, ``strategy.run``, or a function whose result goes
there), or runs after the strategy exists in its scope (created earlier in it, received as
a parameter, held on ``self``, or existing where its function was defined:
``facts.Module.strategy_at``). Not reported: batches per replica by an API's contract
(``contracts.py``), values the code states are global (``intent.py``), and batches of
DTensor, JAX, PyTorch or Keras distribution code (not tf.distribute). One finding per line.

Both follow values through calls: a constant (a literal, a module constant, a parameter
default) that reaches a helper's batch size, in this file or in a project file it imports
(``import data``, ``from .data import f``, ``from pkg.data import f``), is reported at the
call where it enters, naming the ``batch(...)`` it reaches, when a strategy splits it at
that call or anywhere on the way. Calls are followed ``MAX_CALL_DEPTH`` deep; recursion
stops. Values whose origin cannot be followed (parameters nobody binds to a constant,
attributes, calls) are not flagged.

KDP002 (info): a constant learning rate given to an optimizer in a module whose batch
*is* scaled by the replica count: the rate was probably tuned for another batch.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass, replace

from keras_dp_tools.checks.lint.facts import Module
from keras_dp_tools.checks.lint.flow import (
    CONSTANT,
    GLOBAL,
    PARAMETER,
    SCALED,
    SCALED_CALLS,
    TRANSPARENT_CALLS,
    UNKNOWN,
    Flow,
    combine,
    from_input_context,
)
from keras_dp_tools.checks.lint.intent import HINT
from keras_dp_tools.checks.lint.scopes import Scope, Site, arguments_of, bind
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


@dataclass(frozen=True)
class Related:
    """Another place a finding involves: ``path`` None means the same file."""

    path: str | None
    line: int
    col: int
    note: str


class Violation(Finding):
    """A lint finding (``kdt.LintViolation``): a ``Finding`` at 1-based ``line``, 0-based
    ``col`` (as flake8 reports them), with the code's severity (``SEVERITIES``);
    ``related`` the other places it involves (the ``batch(...)`` a value reaches).
    ``violation.format(path)`` is flake8's line; findings sort by place."""

    def __init__(self, line=None, col=None, code="", message="", related=(), **fields):
        fields.setdefault("severity", SEVERITIES[code])
        super().__init__(code=code, message=message, line=line, col=col, related=related, **fields)


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
        self.flows: list[Flow] = []
        self.arguments: list[ast.expr] = []  # call arguments that carry values
        self.defaults: list[_Place] = []  # callee defaults that carry values


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

    def flow(self, module: Module, scope: Scope, node, seen=frozenset()) -> Flow:
        """Where a value comes from: scaled, constant, unknown, or parameters."""
        if isinstance(node, ast.Constant):
            if not isinstance(node.value, (int, float)) or isinstance(node.value, bool):
                return Flow(UNKNOWN)
            if self._named_global(module, scope, node):
                return Flow(GLOBAL)
            return Flow(CONSTANT)
        if isinstance(node, ast.Attribute):
            if node.attr == "num_replicas_in_sync":
                return Flow(SCALED)
            if node.attr in ("global_batch", "target_lr"):  # a plan's fields
                return self.flow(module, scope, node.value, seen)
            return self._imported_flow(module, node, seen)
        if isinstance(node, ast.Name):
            if (id(module), node.id) in seen:
                return Flow(UNKNOWN)
            owner, values, is_parameter = scope.lookup(node.id)
            if module.says_global(node.id, values):
                return Flow(GLOBAL)
            if owner is None:
                return self._imported_flow(module, node, seen)
            seen = seen | {(id(module), node.id)}
            flows = [self.flow(module, owner, value, seen) for value in values]
            if is_parameter:
                flows.append(Flow(PARAMETER, frozenset({(owner, node.id)})))
            return combine(flows)
        if isinstance(node, ast.Call):
            name = (module.collector.qualified(node.func) or "").split(".")[-1]
            if isinstance(node.func, ast.Attribute) and (
                node.func.attr in SCALED_CALLS or from_input_context(node.func)
            ):
                return Flow(SCALED)
            if name in SCALED_CALLS:
                return Flow(SCALED)
            if name in TRANSPARENT_CALLS:
                return combine(self.flow(module, scope, arg, seen) for arg in node.args)
            return Flow(UNKNOWN)
        if isinstance(node, ast.BinOp):
            return combine(
                [self.flow(module, scope, side, seen) for side in (node.left, node.right)]
            )
        if isinstance(node, ast.UnaryOp):
            return self.flow(module, scope, node.operand, seen)
        if isinstance(node, (ast.List, ast.Tuple)) and node.elts:  # bucket_batch_sizes
            return combine(self.flow(module, scope, element, seen) for element in node.elts)
        if isinstance(node, ast.IfExp):
            return combine(
                [self.flow(module, scope, side, seen) for side in (node.body, node.orelse)]
            )
        return Flow(UNKNOWN)

    @staticmethod
    def _named_global(module: Module, scope: Scope, literal: ast.Constant) -> bool:
        """``GLOBAL_BATCH = 64`` earlier in the scope, then ``make(batch_size=64)``: the
        code has named this number the global batch."""
        return any(
            "batch" in name.lower()
            and module.says_global(name, values)
            and any(
                isinstance(value, ast.Constant)
                and value.value == literal.value
                and value.lineno <= literal.lineno
                for value in values
            )
            for name, values in scope.assignments.items()
        )

    def _imported_flow(self, module: Module, node, seen) -> Flow:
        """A module constant of another project file (``from config import BATCH``)."""
        found = self.resolve(module, node) if self.project is not None else None
        if found is None or found[0] != "constant":
            return Flow(UNKNOWN)
        _, owner, name = found
        return self.flow(owner, owner.collector.module, ast.Name(name, ast.Load()), seen)

    # -- through calls -----------------------------------------------------------------

    def callee(self, module: Module, call: ast.Call) -> tuple[Module, Scope] | None:
        if isinstance(call.func, ast.Name) and call.func.id in module.collector.functions:
            return module, module.collector.functions[call.func.id]
        if self.project is None:
            return None
        found = self.resolve(module, call.func)
        return (found[1], found[2]) if found is not None and found[0] == "function" else None

    def through_call(self, module: Module, scope: Scope, call: ast.Call, budget: int):
        """``(sink, binding)`` for each batch size of the called function that this
        call's arguments (or the function's defaults) decide."""
        target = self.callee(module, call)
        if target is None:
            return
        callee_module, callee = target
        for sink in self.summary(callee_module, callee, budget):
            binding = _Binding()
            order = [argument.arg for argument in arguments_of(callee.node)]
            for name in sorted(sink.params, key=order.index):
                bound = bind(call, callee.node, name)
                if bound is None:
                    binding.flows.append(Flow(UNKNOWN))
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

    def summary(self, module: Module, function: Scope, budget: int) -> list[_Sink]:
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
            if not scope.within(function) or module.per_replica(scope):
                continue
            for site in self.checked_sites(module, scope):
                strategy = self.reaches_strategy(module, scope, site)
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
                if module.contracts.covers_node(call):
                    continue
                strategy = self.call_in_strategy(module, scope, call)
                here = _place(module, call, f"{ast.unparse(call.func)}()")
                for sink, binding in self.through_call(module, scope, call, budget - 1):
                    flow = combine(binding.flows) if sink.params else Flow(CONSTANT)
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

    # -- where a strategy is -----------------------------------------------------------

    def checked_sites(self, module: Module, scope: Scope) -> list[Site]:
        """The batch sites of ``scope`` this check judges: not in a per-replica lambda,
        and not a ``batch_size=`` given to a function it follows (judged through it)."""
        sites = []
        for site in scope.batch_sites:
            if module.contracts.covers_node(site.call):
                continue
            if site.size not in site.call.args and self.callee(module, site.call) is not None:
                continue
            sites.append(site)
        return sites

    def reaches_strategy(self, module: Module, scope: Scope, site: Site) -> bool:
        """A strategy exists where the batch is made, or the batch reaches one."""
        return (
            module.strategy_at(scope, site.call.lineno)
            or any(module.reach.reaches(scope, target) for target in site.targets)
            or id(site.call) in module.reach.calls
            or self._fits_distributed_model(module, site.call)
        )

    @staticmethod
    def _fits_distributed_model(module: Module, call: ast.Call) -> bool:
        owner = call.func.value if isinstance(call.func, ast.Attribute) else None
        return module.collector.distributed_model(owner, call.lineno)

    @staticmethod
    def call_in_strategy(module: Module, scope: Scope, call: ast.Call) -> bool:
        return module.strategy_at(scope, call.lineno) or id(call) in module.reach.calls

    def violations(self) -> list[Violation]:
        module = self.module
        found = []
        for scope in module.collector.scopes:
            if module.per_replica(scope):
                continue
            for site in self.checked_sites(module, scope):
                if not self.reaches_strategy(module, scope, site):
                    continue
                if self.flow(module, scope, site.size).kind == CONSTANT:
                    found.append(_local_violation(site))
            for call in scope.calls:
                if not module.contracts.covers_node(call):
                    found += self._call_violations(
                        scope, call, self.call_in_strategy(module, scope, call)
                    )
        found += self._learning_rate_violations()
        return _one_per_line(found)

    def _call_violations(self, scope: Scope, call: ast.Call, strategy: bool) -> list[Violation]:
        found = []
        for sink, binding in self.through_call(self.module, scope, call, MAX_CALL_DEPTH):
            if sink.reported or not (strategy or sink.in_strategy):
                continue
            if sink.params and combine(binding.flows).kind != CONSTANT:
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
        if not any_scaled_batch or not module.any_strategy():
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


def _one_per_line(found: list[Violation]) -> list[Violation]:
    """One batch-size finding per line: a value that is both a literal and a followed
    argument is one mistake (the followed finding says more: it names the batch)."""
    best: dict[tuple, Violation] = {}
    for violation in found:
        key = (violation.line, violation.code == "KDP002")
        kept = best.get(key)
        if kept is None or (violation.related and not kept.related):
            best[key] = violation
    return sorted(best.values())


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
            "this line with '# noqa: KDP003' (or name it GLOBAL_BATCH_SIZE)."
        )
    return (
        "it is not scaled by the replica count: under a strategy it is the global batch, "
        f"split over replicas. Use {scaled} (kdt.scale_batch_size) if it is meant per "
        f"replica. {HINT}"
    )


def _local_violation(site: Site) -> Violation:
    shown = ast.unparse(site.size)
    if site.code == "KDP003":
        message = f"{site.text()} is a constant under a strategy; {_reading('KDP003', shown)}"
    else:
        message = f"batch size {shown}: {_reading('KDP001', shown)}"
    return Violation(site.size.lineno, site.size.col_offset, site.code, message)


def _syntax_violation(error: Exception) -> Violation:
    return Violation(
        getattr(error, "lineno", None) or 1,
        max((getattr(error, "offset", None) or 1) - 1, 0),
        "KDP900",
        f"syntax error, file not checked: {getattr(error, 'msg', error)}",
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
    # ValueError: a null byte; RecursionError: nesting too deep for the parser.
    except (SyntaxError, ValueError, RecursionError) as error:
        return [_syntax_violation(error)]
    lines = source.splitlines()
    return check_tree(tree, filename if project is not None else None, project, label, lines)


def check_tree(
    tree: ast.Module, filename=None, project=None, label=None, lines=None
) -> list[Violation]:
    """``check_source`` on an already parsed module (the flake8 plugin's entry);
    ``lines`` the source lines (for comments that state intent)."""
    if project is not None and filename:
        module = project.register(filename, tree, lines)
    else:
        module = Module(tree, None, lines)
    return Checker(module, project, label).violations()
