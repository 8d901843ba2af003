"""Batches that make sequence windows, not training batches: never the strategy's split.

- ``window.batch(n)`` inside a function or lambda given to ``flat_map``/``interleave``
  (``ds.window(n).flat_map(lambda w: w.batch(n))``);
- a batch whose result is mapped (or unbatched) and then batched again
  (``chars.batch(seq_len + 1).map(split_input_target).batch(64)``, also through names:
  ``sequences = chars.batch(100)``, ``pairs = sequences.map(split)``, ``ds =
  pairs.shuffle(10).batch(64)``): the first cuts sequences, the second is the training
  batch;
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
    """``seq_len + 1`` (or ``1 + seq_len``)."""
    return (
        isinstance(size, ast.BinOp)
        and isinstance(size.op, ast.Add)
        and any(
            isinstance(side, ast.Constant) and side.value == 1 for side in (size.left, size.right)
        )
    )


# Calls between two batches that make the first one a step of the pipeline, not the
# training batch: mapped into (input, target) pairs, or unbatched again.
REWORKING_METHODS = {"map", "unbatch"}
MAX_NAME_STEPS = 4  # names followed back from a training batch to an earlier batch


def _last_value(scope: Scope, name: str, line: int):
    """The call last assigned to ``name`` in ``scope`` on a line before ``line``."""
    values = [
        value
        for value in scope.assignments.get(name, [])
        if isinstance(value, ast.Call) and value.lineno < line
    ]
    return max(values, key=lambda value: value.lineno) if values else None


def _rebatched(scope: Scope, found: set[int]) -> None:
    """A batch whose data is mapped (or unbatched) and batched again, in one chain or
    through names (``sequences = chars.batch(101)``, ``ds = sequences.map(split)``,
    ``ds = ds.shuffle(10).batch(64)``): the first batch cuts sequences."""
    batches = {id(site.call) for site in scope.batch_sites}
    for site in scope.batch_sites:
        if _method(site.call) not in BATCHING_CALLS:
            continue
        calls, base = _chain(site.call)
        reworked = False
        for _ in range(MAX_NAME_STEPS):
            for inner in calls:  # innermost last: a map between two batches
                reworked = reworked or _method(inner) in REWORKING_METHODS
                if reworked and id(inner) in batches and inner is not site.call:
                    found.add(id(inner))
            if not isinstance(base, ast.Name):
                break
            value = _last_value(scope, base.id, calls[-1].lineno if calls else site.call.lineno)
            if value is None:
                break
            inner_calls, base = _chain(value)
            calls = [value, *inner_calls] if isinstance(value.func, ast.Attribute) else []


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
