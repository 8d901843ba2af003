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
from dataclasses import dataclass

from keras_dp_tools.checks.lint.calls import (
    MAX_CALL_DEPTH,
    Binding,
    Calls,
    Place,
    Sink,
    place_of,
    shown_value,
)
from keras_dp_tools.checks.lint.facts import Module
from keras_dp_tools.checks.lint.flow import CONSTANT, SCALED, Flow, combine
from keras_dp_tools.checks.lint.messages import reading, sink_text, value_text
from keras_dp_tools.checks.lint.reach import Entry
from keras_dp_tools.checks.lint.scopes import Scope, Site
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


class Checker(Calls):
    """The checks for one module; ``project`` (a ``runner.Project``) resolves imports
    to other files, ``label`` names a line of this module in messages."""

    def __init__(self, module: Module, project=None, label: Callable[[int], str] | None = None):
        super().__init__(module, project)
        self.label = label or (lambda line: f"line {line}")

    # -- findings ---------------------------------------------------------------------

    def where(self, place: Place) -> str:
        if place.module is self.module:
            return self.label(place.line)
        return f"{self.project.display(place.module.path)}:{place.line}"

    def where_line(self, module: Module, line: int) -> str:
        return self.where(Place(module, line, 0, ""))

    def related(self, place: Place, note: str) -> Related:
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

    def _reached(self, module: Module, entry: Entry, related: list) -> str:
        """``sink_text`` of ``entry`` (in ``module``); when a launcher runs the function
        it is in under its strategy, the launching call joins ``related``."""
        runner = _runner_of(module, entry.sink)
        if runner is not None:
            place = place_of(module, runner, f"{ast.unparse(runner.func)}()")
            related.append(self.related(place, "the launcher enters the strategy's scope here"))
        return sink_text(entry, lambda line: self.where_line(module, line), runner)

    def _local_violation(self, scope: Scope, site: Site, flow: Flow, entry: Entry):
        module = self.module
        shown, defined = self._value(scope, site.size, flow)
        launcher = []
        reaches = self._reached(module, entry, launcher)
        if site.code == "KDP003":
            opening = f"{site.text()}: batch size {shown}, given to {reaches}"
        else:
            opening = f"batch size {shown} reaches {reaches}"
        related = [defined] if defined is not None else []
        if entry.sink is not site.call:
            place = place_of(module, entry.sink, entry.text())
            related.append(self.related(place, "the data reaches the strategy here"))
        related += launcher
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
        place = place_of(flow.origin_module or self.module, origin, ast.unparse(origin))
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

    def _call_violation(self, scope, call, sink: Sink, binding: Binding, entries):
        shown = shown_value(sink, binding)
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
        else:
            reach_module = self.module
            entry = min(entries, key=lambda entry: entry.sink.lineno)
        launcher = []
        strategy = self._reached(reach_module, entry, launcher)
        place = place_of(reach_module, entry.sink, entry.text())
        related.append(self.related(place, "the data reaches the strategy here"))
        related += launcher
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


def _runner_of(module: Module, call: ast.Call) -> ast.Call | None:
    """The launcher call (``MirroredStrategyRunner(...).run(train)``) that runs the
    function ``call`` is in (or one around it) under its strategy, if any."""
    collector = module.collector
    if not collector.runner_calls:
        return None
    scope = next((s for s in collector.scopes if any(c is call for c in s.calls)), None)
    while scope is not None:
        if scope.name in collector.runner_calls and scope.parent is not None:
            return collector.runner_calls[scope.name]
        scope = scope.parent
    return None


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
