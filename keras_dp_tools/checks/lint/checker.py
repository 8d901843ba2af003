"""The KDP checks on one Python source (and, given a project, the files it imports).

KDP001 (error): a batch size given to ``.batch(X)`` (``padded_batch``, ``ragged_batch``,
``dense_to_ragged_batch``, ``bucket_by_sequence_length``'s sizes, a ``keras.utils.Sequence``
or ``PyDataset`` subclass's constructor) or ``batch_size=X`` (other than to
``fit``/``evaluate``/``predict``), where ``X`` is a constant (``values.py``) and the batch
provably reaches what a synchronous strategy splits (``reach.py``: the
``fit``/``evaluate``/``predict`` of a model built or compiled under its scope,
``experimental_distribute_dataset``, ``strategy.run``). A strategy merely existing is not
enough: where the flow cannot be followed, nothing is said.

KDP003 (warning): the same for ``model.fit/evaluate/predict(batch_size=X)`` of such a model.
Keras documents that argument as the global batch, so a constant there may be deliberate:
the message says what each reading implies, and the code can be silenced on its own.

Not reported: batches per replica by an API's contract (``contracts.py``), values the code
states are global (``intent.py``), sequence windows (``windows.py``), and batches of
DTensor, JAX, PyTorch or Keras distribution code (not tf.distribute). One finding per line.

Both follow values through calls: a constant (a literal, a module constant, a parameter
default) that reaches a helper's batch size, in this file or in a project file it imports,
is reported at the call where it enters, naming the ``batch(...)`` it reaches, when the
helper's batch reaches the strategy inside it or the call's result does. Calls are followed
``MAX_CALL_DEPTH`` deep; recursion stops.

KDP002 (info): a constant learning rate given to an optimizer in a module whose batch
*is* scaled by the replica count: the rate was probably tuned for another batch.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass, replace

from keras_dp_tools.checks.lint.collector import class_of, self_attribute
from keras_dp_tools.checks.lint.facts import Module
from keras_dp_tools.checks.lint.flow import CONSTANT, PARAMETER, SCALED, UNKNOWN, Flow, combine
from keras_dp_tools.checks.lint.messages import reading, sink_text, value_text
from keras_dp_tools.checks.lint.reach import Entry
from keras_dp_tools.checks.lint.scopes import Scope, Site, arguments_of, bind
from keras_dp_tools.checks.lint.values import Values
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
    reach: tuple = ()  # (module, Entry): where it reaches the strategy inside the function
    reported: bool = False  # already flagged where the constant entered
    model: str | None = None  # the parameter holding the model a KDP003 fit is called on
    to_result: bool = False  # the batch makes the function's result


class _Binding:
    """What a call passes for a sink's parameters."""

    def __init__(self):
        self.flows: list[Flow] = []
        self.arguments: list[ast.expr] = []  # call arguments that carry values
        self.defaults: list[_Place] = []  # callee defaults that carry values


def _inside(entries: list[Entry], function: Scope | None) -> list[Entry]:
    """The entries that reach the strategy without leaving ``function`` by its result."""
    if function is None or function.name is None:
        return entries
    return [entry for entry in entries if function.name not in entry.via]


class Checker(Values):
    """The checks for one module; ``project`` (a ``runner.Project``) resolves imports
    to other files, ``label`` names a line of this module in messages."""

    def __init__(self, module: Module, project=None, label: Callable[[int], str] | None = None):
        super().__init__(module, project)
        self.label = label or (lambda line: f"line {line}")
        self._summaries: dict = {}
        self._active: set = set()

    # -- through calls -----------------------------------------------------------------

    def callee(self, module: Module, call: ast.Call, scope: Scope | None = None):
        """``(module, function)`` a call runs: a function of this file or of a project
        file it imports, or (read in ``scope``) a method of its class (``self.make(64)``)."""
        if isinstance(call.func, ast.Name) and call.func.id in module.collector.functions:
            return module, module.collector.functions[call.func.id]
        if scope is not None and self_attribute(call.func) and class_of(scope):
            methods = [
                method
                for method in module.collector.all_functions.get(call.func.attr, [])
                if method.class_name == class_of(scope)
            ]
            return (module, methods[0]) if len(methods) == 1 else None
        if self.project is None:
            return None
        found = self.resolve(module, call.func)
        return (found[1], found[2]) if found is not None and found[0] == "function" else None

    def through_call(self, module: Module, scope: Scope, call: ast.Call, budget: int):
        """``(sink, binding)`` for each batch size of the called function that this
        call's arguments (or the function's defaults) decide."""
        target = self.callee(module, call, scope)
        if target is None:
            return
        callee_module, callee = target
        method = self_attribute(call.func) is not None
        for sink in self.summary(callee_module, callee, budget):
            binding = _Binding()
            order = [argument.arg for argument in arguments_of(callee.node)]
            for name in sorted(sink.params, key=order.index):
                bound = bind(call, callee.node, name, skip_self=method)
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
                entries = self.site_reach(module, scope, site)
                inside = tuple((module, e) for e in _inside(entries, function))[:1]
                flow = self.flow(module, scope, site.size)
                batch = _place(module, site.size, site.text())  # on the batch(...) line
                size = ast.unparse(site.size)
                model = None if entries else _model_parameter(site, function)
                result = module.makes_result(site.call, function)
                if flow.kind == CONSTANT:
                    sinks.append(
                        _Sink(
                            frozenset(),
                            site.code,
                            batch,
                            size,
                            size,
                            (),
                            inside,
                            bool(entries),
                            model,
                            result,
                        )
                    )
                elif flow.kind == PARAMETER and all(owner is function for owner, _ in flow.params):
                    names = frozenset(name for _, name in flow.params)
                    sinks.append(
                        _Sink(names, site.code, batch, "", size, (), inside, False, model, result)
                    )
            for call in scope.calls:
                if module.contracts.covers_node(call):
                    continue
                inside = tuple((module, e) for e in _inside(module.reach.of_call(call), function))
                here = _place(module, call, f"{ast.unparse(call.func)}()")
                for sink, binding in self.through_call(module, scope, call, budget - 1):
                    flow = combine(binding.flows) if sink.params else Flow(CONSTANT)
                    sink = self._pass_model(module, scope, call, sink, function)
                    reach = sink.reach or (inside[:1] if sink.to_result else ())
                    result = sink.to_result and module.makes_result(call, function)
                    through = (here, *sink.through)
                    if flow.kind == CONSTANT:
                        sinks.append(
                            replace(
                                sink,
                                params=frozenset(),
                                shown=_shown(sink, binding),
                                through=through,
                                reach=reach,
                                reported=sink.reported or bool(reach),
                                to_result=result,
                            )
                        )
                    elif flow.kind == PARAMETER and all(
                        owner is function for owner, _ in flow.params
                    ):
                        names = frozenset(name for _, name in flow.params)
                        sinks.append(
                            replace(
                                sink, params=names, through=through, reach=reach, to_result=result
                            )
                        )
        self._active.discard((id(module), id(function)))
        self._summaries[key] = sinks
        return sinks

    def _pass_model(self, module, scope, call, sink: _Sink, function) -> _Sink:
        """A fit inside the callee on the model this call passes: reached when the model
        passed is one a strategy built, still open when it is the caller's parameter."""
        if sink.model is None:
            return sink
        target = self.callee(module, call, scope)
        method = self_attribute(call.func) is not None
        bound = bind(call, target[1].node, sink.model, method) if target is not None else None
        if bound is None or bound[0] != "argument":
            return replace(sink, model=None)
        if module.collector.distributed_model(bound[1], call.lineno, scope):
            return replace(sink, model=None, reach=((module, Entry(call)),))
        if (
            isinstance(bound[1], ast.Name)
            and function is not None
            and bound[1].id in function.parameters
        ):
            return replace(sink, model=bound[1].id)
        return replace(sink, model=None)

    # -- where the strategy is reached ----------------------------------------------------

    def checked_sites(self, module: Module, scope: Scope) -> list[Site]:
        """The batch sites of ``scope`` this check judges: not per replica by contract,
        not a sequence window, and not a ``batch_size=`` given to a function it follows
        (judged through it)."""
        sites = []
        for site in scope.batch_sites:
            if module.contracts.covers_node(site.call) or id(site.call) in module.windows:
                continue
            if site.size not in site.call.args and self.callee(module, site.call, scope):
                continue
            sites.append(site)
        return sites

    @staticmethod
    def site_reach(module: Module, scope: Scope, site: Site) -> list[Entry]:
        """Where the batch made at ``site`` reaches a synchronous strategy (none: it is
        not proven to)."""
        if site.code == "KDP003":
            owner = site.call.func.value if isinstance(site.call.func, ast.Attribute) else None
            if module.collector.distributed_model(owner, site.call.lineno, scope):
                return [Entry(site.call)]
            return []
        return list(module.reach.of_call(site.call))

    # -- findings ---------------------------------------------------------------------

    def where(self, place: _Place) -> str:
        if place.module is self.module:
            return self.label(place.line)
        return f"{self.project.display(place.module.path)}:{place.line}"

    def where_line(self, module: Module, line: int) -> str:
        return self.where(_Place(module, line, 0, ""))

    def related(self, place: _Place, note: str) -> Related:
        path = None if place.module is self.module else self.project.display(place.module.path)
        return Related(path, place.line, place.col, note)

    def violations(self) -> list[Violation]:
        module = self.module
        found = []
        for scope in module.collector.scopes:
            if module.per_replica(scope):
                continue
            for site in self.checked_sites(module, scope):
                entries = self.site_reach(module, scope, site)
                if not entries:
                    continue
                flow = self.flow(module, scope, site.size)
                if flow.kind == CONSTANT:
                    first = min(entries, key=lambda entry: entry.sink.lineno)
                    found.append(self._local_violation(scope, site, flow, first))
            for call in scope.calls:
                if not module.contracts.covers_node(call):
                    found += self._call_violations(scope, call, module.reach.of_call(call))
        found += self._learning_rate_violations()
        return _one_per_line(found)

    def _local_violation(self, scope: Scope, site: Site, flow: Flow, entry: Entry):
        module = self.module
        shown, defined = self._value(scope, site.size, flow)
        reaches = sink_text(entry, self.label)
        if site.code == "KDP003":
            opening = f"{site.text()}: batch size {shown}, given to {reaches}"
        else:
            opening = f"batch size {shown} reaches {reaches}"
        related = [defined] if defined is not None else []
        if entry.sink is not site.call:
            place = _place(module, entry.sink, entry.text())
            related.append(self.related(place, "the data reaches the strategy here"))
        plain = ast.unparse(site.size)
        return Violation(
            site.size.lineno,
            site.size.col_offset,
            site.code,
            f"{opening}; {reading(site.code, plain)}",
            tuple(related),
        )

    def _value(self, scope: Scope, expression: ast.expr, flow: Flow):
        """``BATCH_SIZE (= 64), defined at line 12`` and the definition as a related place
        (None when the constant is written where it is used)."""
        value = self.evaluate(self.module, scope, expression)
        origin = flow.origin
        if (
            value is None
            and isinstance(origin, ast.Constant)
            and not isinstance(expression, (ast.BinOp, ast.UnaryOp, ast.Call))
        ):
            value = origin.value  # args.batch_size, CFG.batch_size: its default
        shown = value_text(expression, value)
        if origin is None:
            return shown, None
        place = _place(flow.origin_module or self.module, origin, ast.unparse(origin))
        if place.module is self.module and place.line == expression.lineno:
            return shown, None
        return f"{shown}, defined at {self.where(place)}", self.related(
            place, "the value is defined here"
        )

    def _call_violations(self, scope: Scope, call: ast.Call, entries) -> list[Violation]:
        found = []
        for sink, binding in self.through_call(self.module, scope, call, MAX_CALL_DEPTH):
            sink = self._pass_model(self.module, scope, call, sink, None)
            if sink.reported or not (sink.reach or (entries and sink.to_result)):
                continue
            if sink.params and combine(binding.flows).kind != CONSTANT:
                continue
            found.append(self._call_violation(scope, call, sink, binding, entries))
        return found

    def _call_violation(self, scope, call, sink: _Sink, binding: _Binding, entries):
        shown = _shown(sink, binding)
        callee = f"{ast.unparse(call.func)}()"
        at = self.label(call.lineno)
        reaches = f"{sink.batch.text} at {self.where(sink.batch)}"
        if sink.through:
            steps = ", ".join(f"{step.text} at {self.where(step)}" for step in sink.through)
            reaches += f" (through {steps})"
        related = [self.related(sink.batch, "the batch size is used here")]
        related += [self.related(step, "called here") for step in sink.through]
        if sink.reach:
            reach_module, entry = sink.reach[0]
            strategy = sink_text(entry, lambda line: self.where_line(reach_module, line))
        else:
            reach_module = self.module
            entry = min(entries, key=lambda entry: entry.sink.lineno)
            strategy = sink_text(entry, self.label)
        place = _place(reach_module, entry.sink, entry.text())
        related.append(self.related(place, "the data reaches the strategy here"))
        if binding.arguments:
            first = binding.arguments[0]
            anchor = (first.lineno, first.col_offset)
            values = ", ".join(ast.unparse(argument) for argument in binding.arguments)
            if len(binding.arguments) == 1:  # BATCH (= 64), defined at line 3
                values, defined = self._value(scope, first, binding.flows[0])
                related += [defined] if defined is not None else []
            opening = f"batch size {values} passed to {callee} at {at} reaches {reaches}"
            if len(binding.flows) > 1:
                opening = f"{values} passed to {callee} at {at} make {reaches} constant"
        elif binding.defaults:
            default = binding.defaults[0]
            # the constant is written at the default: the place to fix (and to silence)
            same_file = default.module is self.module
            anchor = (default.line, default.col) if same_file else (call.lineno, call.col_offset)
            opening = (
                f"{callee} at {at} leaves {default.text} (its default, "
                f"{self.where(default)}), which reaches {reaches}"
            )
            related.append(self.related(default, "the default is set here"))
        else:
            anchor = (call.lineno, call.col_offset)
            opening = f"{callee} at {at} runs {reaches} with the constant batch size {shown}"
        return Violation(
            *anchor,
            sink.code,
            f"{opening}, and the data reaches {strategy}; {reading(sink.code, shown)}",
            tuple(related),
        )

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
        if kept is None or len(violation.related) > len(kept.related):
            best[key] = violation
    return sorted(best.values())


def _model_parameter(site: Site, function: Scope) -> str | None:
    """``model`` for ``model.fit(batch_size=...)`` where ``model`` is ``function``'s parameter."""
    owner = site.call.func.value if isinstance(site.call.func, ast.Attribute) else None
    if site.code == "KDP003" and isinstance(owner, ast.Name) and owner.id in function.parameters:
        return owner.id
    return None


def _shown(sink: _Sink, binding: _Binding) -> str:
    """The constant as the user wrote it; with several, the batch size expression."""
    if not sink.params:
        return sink.shown
    values = [ast.unparse(argument) for argument in binding.arguments]
    values += [default.text.split("=", 1)[1] for default in binding.defaults]
    return values[0] if len(values) == 1 else f"({sink.size})"


def syntax_violation(error: Exception, what: str = "file") -> Violation:
    """KDP900 for a parse error: the ``what`` (a file, a notebook cell) is not checked."""
    return Violation(
        getattr(error, "lineno", None) or 1,
        max((getattr(error, "offset", None) or 1) - 1, 0),
        "KDP900",
        f"syntax error, {what} not checked: {getattr(error, 'msg', error)}",
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
        return [syntax_violation(error)]
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
