"""Batches that are per replica by an API's contract: scaling them would be the mistake.

- the ``dataset_fn`` given to ``distribute_datasets_from_function`` (and its
  ``experimental_`` name), to ``DatasetCreator`` and to
  ``ClusterCoordinator.create_per_worker_dataset``;
- an Estimator's ``input_fn`` (``input_fn=`` of its methods, ``TrainSpec``, ``EvalSpec``, or
  a module function given first to a method, where data would go, as in
  ``estimator.evaluate(input_fn, steps)``): with ``RunConfig(train_distribute=...)`` it is
  called once per replica;
- a function taking an ``input_context`` (or a parameter annotated ``InputContext``).

Values computed from an input context are per replica too (see ``PER_REPLICA_CALLS``).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

DATASET_FN_CALLS = {
    "distribute_datasets_from_function",
    "experimental_distribute_datasets_from_function",
    "create_per_worker_dataset",
    "DatasetCreator",
}
# Methods taking a function that is not an input function (a step, a map, a filter).
FUNCTION_METHODS = {
    "run",
    "experimental_run_v2",
    "map",
    "filter",
    "flat_map",
    "interleave",
    "apply",
    "reduce",
    "scan",
}
CONTEXT_PARAMETERS = {"input_context"}


@dataclass
class Contracts:
    """Functions (by name) and lambdas (by node id) whose batches are per replica."""

    functions: set[str] = field(default_factory=set)
    lambdas: set[int] = field(default_factory=set)  # ids of every node inside such lambdas

    def covers_function(self, function) -> bool:
        return function is not None and getattr(function, "name", None) in self.functions

    def covers_node(self, node) -> bool:
        return id(node) in self.lambdas


def _given(value, functions: set[str], contracts: Contracts) -> None:
    if isinstance(value, ast.Name) and value.id in functions:
        contracts.functions.add(value.id)
    elif isinstance(value, ast.Lambda):
        contracts.lambdas.update(id(node) for node in ast.walk(value))


def per_replica_contracts(tree: ast.Module) -> Contracts:
    """The per-replica functions and lambdas of a module."""
    contracts = Contracts()
    functions = {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            if any(
                argument.arg in CONTEXT_PARAMETERS
                or (
                    argument.annotation is not None
                    and ast.unparse(argument.annotation).endswith("InputContext")
                )
                for argument in arguments
            ):
                contracts.functions.add(node.name)
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        for keyword in node.keywords:
            if keyword.arg in ("input_fn", "dataset_fn"):
                _given(keyword.value, functions, contracts)
        if name in DATASET_FN_CALLS and node.args:
            _given(node.args[0], functions, contracts)
        elif isinstance(func, ast.Attribute) and name not in FUNCTION_METHODS and node.args:
            # estimator.train(input_fn, steps): a function given where data would go
            _given(node.args[0], functions, contracts)
    return contracts
