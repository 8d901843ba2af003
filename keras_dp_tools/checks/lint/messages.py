"""What a KDP finding says: the value, where it is defined, where it reaches the strategy,
what it means there and the fix for each intent."""

from __future__ import annotations

import ast

from keras_dp_tools.checks.lint.intent import HINT
from keras_dp_tools.checks.lint.reach import DISTRIBUTE_CALLS, RUN_CALLS, Entry


def value_text(expression: ast.expr, value) -> str:
    """``64``, or ``BATCH_SIZE (= 64)`` for a name or expression worked out to 64."""
    written = ast.unparse(expression)
    if value is None or written == _number(value):
        return written
    return f"{written} (= {_number(value)})"


def _number(value) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def sink_text(entry: Entry, where, runner: ast.Call | None = None) -> str:
    """Where data reaches the strategy: the call and what it is; ``runner`` the launcher
    call (``MirroredStrategyRunner(...).run(train)``) whose strategy scope it is in."""
    func = entry.sink.func
    name = func.attr if isinstance(func, ast.Attribute) else ""
    at = f"{entry.text()} at {where(entry.sink.lineno)}"
    if name in DISTRIBUTE_CALLS:
        return f"the strategy at {at}"
    if name in RUN_CALLS:
        return f"the strategy at {at}"
    if runner is not None:
        return (
            f"{at} (a model built under the MultiWorkerMirroredStrategy scope that "
            f"{ast.unparse(runner.func)}() at {where(runner.lineno)} runs it in)"
        )
    return f"{at} (a model built under a synchronous strategy's scope)"


def reading(code: str, shown: str) -> str:
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
