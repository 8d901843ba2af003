"""Batch sizes followed through calls: the sinks of a function (batch sizes its
parameters, or constants inside it, decide) and what a call binds to them.

A sink remembers where its batch reaches a synchronous strategy inside the function
(``reach``), whether the batch makes the function's result (``to_result``: a call whose
result reaches the strategy then carries it there), and, for ``fit(batch_size=...)`` on a
parameter, which parameter holds the model (``model``: the caller's argument decides).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, replace

from keras_dp_tools.checks.lint.facts import Module
from keras_dp_tools.checks.lint.flow import CONSTANT, PARAMETER, UNKNOWN, Flow, combine
from keras_dp_tools.checks.lint.reach import Entry
from keras_dp_tools.checks.lint.scopes import Scope, Site, arguments_of, bind
from keras_dp_tools.checks.lint.strategies import class_of, self_attribute
from keras_dp_tools.checks.lint.values import Values

MAX_CALL_DEPTH = 4  # calls followed from a call site down to a batch(...)


@dataclass(frozen=True)
class Place:
    module: Module
    line: int
    col: int
    text: str


def place_of(module: Module, node, text: str) -> Place:
    return Place(module, node.lineno, node.col_offset, text)


@dataclass(frozen=True)
class Sink:
    """A batch size inside a function that is constant once ``params`` (names of that
    function's parameters) are: what a call to the function can make constant."""

    params: frozenset
    code: str
    batch: Place  # the batch(...) it reaches
    shown: str  # the constant, for sinks already constant inside the function
    size: str  # the batch size as written at the batch(...)
    through: tuple[Place, ...] = ()  # calls from the function down to the batch
    reach: tuple = ()  # (module, Entry): where it reaches the strategy inside the function
    reported: bool = False  # already flagged where the constant entered
    model: str | None = None  # the parameter holding the model a KDP003 fit is called on
    to_result: bool = False  # the batch makes the function's result


class Binding:
    """What a call passes for a sink's parameters."""

    def __init__(self):
        self.flows: list[Flow] = []
        self.arguments: list[ast.expr] = []  # call arguments that carry values
        self.defaults: list[Place] = []  # callee defaults that carry values


def inside_function(entries: list[Entry], function: Scope | None) -> list[Entry]:
    """The entries that reach the strategy without leaving ``function`` by its result."""
    if function is None or function.name is None:
        return entries
    return [entry for entry in entries if function.name not in entry.via]


class Calls(Values):
    """Values and sinks followed through the calls of a module (and of the project files
    it imports); ``Checker`` turns them into findings."""

    def __init__(self, module: Module, project=None):
        super().__init__(module, project)
        self._summaries: dict = {}
        self._active: set = set()

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
            binding = Binding()
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
                        place_of(callee_module, default, f"{name}={ast.unparse(default)}")
                    )
            yield sink, binding

    def summary(self, module: Module, function: Scope, budget: int) -> list[Sink]:
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
                inside = tuple((module, e) for e in inside_function(entries, function))[:1]
                flow = self.flow(module, scope, site.size)
                batch = place_of(module, site.size, site.text())  # on the batch(...) line
                size = ast.unparse(site.size)
                model = None if entries else model_parameter(site, function)
                result = module.makes_result(site.call, function)
                if flow.kind == CONSTANT:
                    sinks.append(
                        Sink(
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
                        Sink(names, site.code, batch, "", size, (), inside, False, model, result)
                    )
            for call in scope.calls:
                if module.contracts.covers_node(call):
                    continue
                reached = inside_function(module.reach.of_call(call), function)
                inside = tuple((module, entry) for entry in reached)
                here = place_of(module, call, f"{ast.unparse(call.func)}()")
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
                                shown=shown_value(sink, binding),
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

    def _pass_model(self, module, scope, call, sink: Sink, function) -> Sink:
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


def model_parameter(site: Site, function: Scope) -> str | None:
    """``model`` for ``model.fit(batch_size=...)`` where ``model`` is ``function``'s parameter."""
    owner = site.call.func.value if isinstance(site.call.func, ast.Attribute) else None
    if site.code == "KDP003" and isinstance(owner, ast.Name) and owner.id in function.parameters:
        return owner.id
    return None


def shown_value(sink: Sink, binding: Binding) -> str:
    """The constant as the user wrote it; with several, the batch size expression."""
    if not sink.params:
        return sink.shown
    values = [ast.unparse(argument) for argument in binding.arguments]
    values += [default.text.split("=", 1)[1] for default in binding.defaults]
    return values[0] if len(values) == 1 else f"({sink.size})"
