"""Where a batch size comes from: the kinds of value the checks tell apart."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

# Calls whose result is already per replica or scaled by the replica count.
SCALED_CALLS = {
    "scale_batch_size",
    "get_per_replica_batch_size",
    "scale_learning_rate",
    "plan_scaling",
    "warmup_schedule",
}
# Calls that keep the provenance of their arguments.
TRANSPARENT_CALLS = {"int", "round", "max", "min", "float", "abs"}
# GLOBAL: the code says the value is the global batch (intent.py): not the mistake.
SCALED, GLOBAL, CONSTANT, UNKNOWN, PARAMETER = (
    "scaled",
    "global",
    "constant",
    "unknown",
    "parameter",
)


@dataclass(frozen=True)
class Flow:
    kind: str
    params: frozenset = frozenset()  # (scope, name) pairs, for PARAMETER
    origin: ast.AST | None = field(default=None, compare=False)  # where a constant is written
    origin_module: object = field(default=None, compare=False)  # the facts.Module it is in


def combine(flows) -> Flow:
    flows = list(flows)
    kinds = {flow.kind for flow in flows}
    if SCALED in kinds:
        return Flow(SCALED)
    if GLOBAL in kinds:
        return Flow(GLOBAL)
    if UNKNOWN in kinds or not flows:
        return Flow(UNKNOWN)
    params = frozenset().union(*(flow.params for flow in flows))
    first = next((flow for flow in flows if flow.origin is not None), Flow(CONSTANT))
    kind = PARAMETER if params else CONSTANT
    return Flow(kind, params, first.origin, first.origin_module)


def from_input_context(func: ast.Attribute) -> bool:
    """``input_context.<anything>``: per replica by contract."""
    owner = func.value
    return isinstance(owner, ast.Name) and owner.id in ("input_context", "context", "ctx")
