"""What a synchronous strategy splits: the data it is given, followed back to where it is made.

Data reaches the strategy when it is given to ``strategy.experimental_distribute_dataset``,
to ``strategy.run``, or to ``fit``/``evaluate``/``predict`` of a model built or compiled
under a synchronous strategy's scope (``collector.py``). From there it is followed back
through what made it: assignments (``ds = ds.with_options(o)``, ``train, val = make()``,
``for batch in ds``), the results of this file's functions and methods (their ``return``
values), their parameters (the arguments their callers pass), containers
(``data["train"] = ds``) and ``self`` attributes (``self.train_ds = ...``). Each place reached
remembers where its data reaches the strategy, for the message.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass, field

from keras_dp_tools.checks.lint.collector import Collector
from keras_dp_tools.checks.lint.scopes import GLOBAL_BATCH_METHODS, Scope, bind
from keras_dp_tools.checks.lint.strategies import class_of, self_attribute

DISTRIBUTE_CALLS = {"experimental_distribute_dataset", "distribute_dataset"}
RUN_CALLS = {"run", "experimental_run_v2", "experimental_run"}
MODEL_CALLS = GLOBAL_BATCH_METHODS | {"fit_generator", "evaluate_generator", "predict_generator"}
DATA_KEYWORDS = {"x", "validation_data", "args", "generator", "kwargs"}
MAX_ENTRIES = 16  # ways a place reaches the strategy, kept for messages and function bounds


@dataclass(frozen=True)
class Entry:
    """Where data reaches the strategy (``sink``, the call) and the functions whose
    results were followed to get here (``via``)."""

    sink: ast.Call
    via: frozenset = frozenset()

    def text(self) -> str:
        return f"{ast.unparse(self.sink.func)}()"


@dataclass
class Reach:
    """Names (``(id of the defining scope, name)``), ``self`` attributes (``(class,
    attribute)``) and calls (by id) whose data the strategy distributes."""

    names: dict = field(default_factory=lambda: defaultdict(list))
    attributes: dict = field(default_factory=lambda: defaultdict(list))
    calls: dict = field(default_factory=lambda: defaultdict(list))

    @staticmethod
    def put(table: dict, key, entry: Entry) -> bool:
        """Records ``entry`` under ``key`` unless one of the same sink reached with fewer
        functions is there (or enough are: ``MAX_ENTRIES``)."""
        kept = table[key]
        if len(kept) >= MAX_ENTRIES or any(
            old.sink is entry.sink and old.via <= entry.via for old in kept
        ):
            return False
        table[key].append(entry)
        return True

    def of_call(self, call: ast.Call) -> list[Entry]:
        return self.calls.get(id(call), [])


def callees(collector: Collector, call: ast.Call, nested: bool = True):
    """The functions of this file a call runs, each with the (parameter, value) pairs the
    call passes by position or keyword; ``nested`` False: module-level functions and
    methods only."""
    func = call.func
    if isinstance(func, ast.Name):
        found, skip = collector.all_functions.get(func.id, []), 0
        found = [f for f in found if not f.class_name]
        if not nested:
            found = [collector.functions[func.id]] if func.id in collector.functions else []
    elif self_attribute(func):
        found = [f for f in collector.all_functions.get(func.attr, []) if f.class_name]
        skip = 1
    else:
        return
    for callee in found:
        parameters = callee.parameters[skip:]
        passed = [
            (parameters[index] if index < len(parameters) else None, value)
            for index, value in enumerate(call.args)
        ] + [(keyword.arg, keyword.value) for keyword in call.keywords]
        yield callee, [(name, value) for name, value in passed if name]


def given_data(collector: Collector, scope: Scope, call: ast.Call) -> list[ast.expr]:
    """The data a call gives a synchronous strategy to split, if any."""
    func = call.func
    if not isinstance(func, ast.Attribute):
        return []
    data = [k.value for k in call.keywords if k.arg in DATA_KEYWORDS]
    owner = func.value
    if func.attr in DISTRIBUTE_CALLS and collector.is_strategy_value(owner, call.lineno, scope):
        return call.args[:1] + data
    if func.attr in RUN_CALLS and collector.is_strategy_value(owner, call.lineno, scope):
        return call.args[1:] + data
    if func.attr in MODEL_CALLS and collector.distributed_model(owner, call.lineno, scope):
        return call.args[:1] + data
    return []


# Calls that turn data into NumPy values: examples, no longer the batches a strategy splits.
MATERIALIZING_METHODS = {"numpy", "get_next", "as_numpy_iterator", "eval"}


def _walk(collector: Collector, scope: Scope, node):
    """``ast.walk`` that leaves lambdas alone (their parameters are not this scope's
    names) and stops at calls that make NumPy values of data (``.numpy()``,
    ``iterator.get_next()``, a session's ``run``, ``np.array(...)``)."""
    todo = [node]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Call) and _materializes(collector, scope, node):
            continue
        yield node
        todo.extend(c for c in ast.iter_child_nodes(node) if not isinstance(c, ast.Lambda))


def _materializes(collector: Collector, scope: Scope, call: ast.Call) -> bool:
    func = call.func
    if isinstance(func, ast.Attribute):
        if func.attr in MATERIALIZING_METHODS:
            return True
        if func.attr in RUN_CALLS and not collector.is_strategy_value(
            func.value, call.lineno, scope
        ):
            return True  # sess.run(...)
    return (collector.qualified(func) or "").startswith("numpy.")


class _Follower:
    def __init__(self, collector: Collector):
        self.collector = collector
        self.reach = Reach()
        self.callers = defaultdict(list)  # id of a function scope -> [(scope, call)]
        for scope in collector.scopes:
            for call in scope.calls:
                for callee, _ in callees(collector, call):
                    self.callers[id(callee)].append((scope, call))
        self.work: list[tuple[Scope, ast.expr, Entry]] = []

    def add(self, scope: Scope, expression, entry: Entry) -> None:
        for node in _walk(self.collector, scope, expression):
            if isinstance(node, ast.Name):
                self._name(scope, node, entry)
            elif self_attribute(node) and class_of(scope):
                key = (class_of(scope), node.attr)
                if self.reach.put(self.reach.attributes, key, entry):
                    for where, value in self.collector.class_values.get(key, []):
                        self.work.append((where, value, entry))
            elif isinstance(node, ast.Call) and self.reach.put(self.reach.calls, id(node), entry):
                for callee, _ in callees(self.collector, node):
                    via = entry.via | {callee.name}
                    for value in callee.returns:
                        self.work.append((callee, value, Entry(entry.sink, via)))

    def _name(self, scope: Scope, node: ast.Name, entry: Entry) -> None:
        owner, _, is_parameter = scope.lookup(node.id)
        owner = owner or scope
        if not self.reach.put(self.reach.names, (id(owner), node.id), entry):
            return
        line = getattr(node, "lineno", None)
        for assigned in (owner.assignments, owner.unpacked):
            for value in assigned.get(node.id, []):
                # in the same scope, only what was assigned before it was read
                if owner is scope and line is not None and getattr(value, "lineno", 0) > line:
                    continue
                self.work.append((owner, value, entry))
        if is_parameter and owner.node is not None:
            for caller, call in self.callers.get(id(owner), []):
                bound = bind(call, owner.node, node.id, skip_self=bool(owner.class_name))
                if bound is not None and bound[0] == "argument":
                    self.work.append((caller, bound[1], entry))

    def run(self) -> Reach:
        for scope in self.collector.scopes:
            for call in scope.calls:
                for expression in given_data(self.collector, scope, call):
                    self.add(scope, expression, Entry(call))
        while self.work:
            self.add(*self.work.pop())
        return self.reach


def distributed_data(collector: Collector) -> Reach:
    """Where the data of a module's strategies comes from."""
    return _Follower(collector).run()


def returned_data(collector: Collector) -> Reach:
    """Where the results of a module's functions come from: each place reached records
    an ``Entry`` whose ``sink`` is the function (its ``def`` node) whose result it makes."""
    follower = _Follower(collector)
    for scope in collector.scopes:
        if scope.node is not None:
            follower.work += [(scope, value, Entry(scope.node)) for value in scope.returns]
    while follower.work:
        follower.add(*follower.work.pop())
    return follower.reach
