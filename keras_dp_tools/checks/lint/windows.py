"""Batches that make sequence windows, not training batches: never the strategy's split.

- ``window.batch(n)`` inside a function or lambda given to ``flat_map``/``interleave``
  (``ds.window(n).flat_map(lambda w: w.batch(n))``);
- a batch whose result is mapped and then batched again
  (``chars.batch(seq_len + 1).map(split_input_target).batch(64)``, also through a name:
  ``sequences = chars.batch(101)`` then ``sequences.map(split).batch(64)``): the first
  cuts sequences, the second is the training batch;
- ``.batch(seq_len + 1)`` (a length plus one: input and target shifted by one).
"""

from __future__ import annotations

import ast

from keras_dp_tools.checks.lint.collector import Collector
from keras_dp_tools.checks.lint.scopes import BATCHING_CALLS, Scope


def _chain(call: ast.Call) -> tuple[list[ast.Call], ast.expr]:
    """The calls a method call is made on (innermost last) and the chain's base."""
    calls = []
    node = call.func.value if isinstance(call.func, ast.Attribute) else None
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        calls.append(node)
        node = node.func.value
    return calls, node


def _method(call: ast.Call) -> str:
    return call.func.attr if isinstance(call.func, ast.Attribute) else ""


def _plus_one(size) -> bool:
    return (
        isinstance(size, ast.BinOp)
        and isinstance(size.op, ast.Add)
        and isinstance(size.right, ast.Constant)
        and size.right.value == 1
    )


def _rebatched(scope: Scope, found: set[int]) -> None:
    batches = {id(site.call): site for site in scope.batch_sites}
    for site in scope.batch_sites:
        if _method(site.call) not in BATCHING_CALLS:
            continue
        calls, base = _chain(site.call)
        mapped = False
        for inner in calls:  # innermost last: a map between two batches
            mapped = mapped or _method(inner) == "map"
            if mapped and id(inner) in batches:
                found.add(id(inner))
        if not mapped:
            continue
        if isinstance(base, ast.Name):
            for other in scope.batch_sites:
                if (
                    base.id in other.targets
                    and other.call.lineno <= site.call.lineno
                    and other is not site
                    and _method(other.call) in BATCHING_CALLS
                ):
                    found.add(id(other.call))


def window_batches(collector: Collector) -> set[int]:
    """The ids of the batch calls of a module that make sequence windows."""
    found = set(collector.window_calls)
    for name in collector.window_functions:
        for function in collector.all_functions.get(name, []):
            for scope in collector.scopes:
                if scope.within(function):
                    found.update(id(site.call) for site in scope.batch_sites)
    for scope in collector.scopes:
        _rebatched(scope, found)
        found.update(
            id(site.call)
            for site in scope.batch_sites
            if _method(site.call) in BATCHING_CALLS and _plus_one(site.size)
        )
    return found
