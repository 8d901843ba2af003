"""Stated intent: a value the code itself treats as the global batch is not the mistake.

A value reads as global when
- its name says so (``global_batch_size``, ``GLOBAL_BATCH``, ``total_batch``);
- the code divides it by the replica, core or worker count
  (``batch_size // strategy.num_replicas_in_sync``), asks an input context for its
  per-replica share (``get_per_replica_batch_size(batch_size)``), or gives it as the
  ``global_batch_size`` of ``tf.nn.compute_average_loss``;
- a comment on its definition says it is the total (``BATCH = 256  # global batch``).
"""

from __future__ import annotations

import ast
import re

GLOBAL_NAME = re.compile(r"(?i)global|total")
GLOBAL_COMMENT = re.compile(
    r"(?i)#.*\b(global|total|in all|across (all )?(the )?(replicas|devices|gpus|cores|workers)"
    r"|all (replicas|devices|gpus|cores|workers))\b"
)
# Names of a replica, core, device or worker count.
COUNT_NAME = re.compile(
    r"(?i)^(num_?|n_?)?(replica|core|tpu_core|gpu|device|worker)s?(_count|_in_sync|_num)?$"
)
HINT = (
    "If it is meant as the global batch, say so: name it so (GLOBAL_BATCH_SIZE) or write "
    "'# global batch' on its definition."
)


def says_global(name: str) -> bool:
    return GLOBAL_NAME.search(name) is not None


def _is_count(node) -> bool:
    for part in ast.walk(node):
        if isinstance(part, ast.Attribute) and (
            part.attr == "num_replicas_in_sync" or COUNT_NAME.match(part.attr)
        ):
            return True
        if isinstance(part, ast.Name) and COUNT_NAME.match(part.id):
            return True
    return False


def divided_names(tree: ast.Module) -> set[str]:
    """Names the code treats as a total to share out over replicas."""
    names = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, (ast.Div, ast.FloorDiv))
            and isinstance(node.left, ast.Name)
            and _is_count(node.right)
        ):
            names.add(node.left.id)
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            given = [*node.args[:1]] if name == "get_per_replica_batch_size" else []
            given += [k.value for k in node.keywords if k.arg == "global_batch_size"]
            names.update(value.id for value in given if isinstance(value, ast.Name))
    return names


def commented_global(lines: list[str] | None, value: ast.expr) -> bool:
    """Whether a comment on the definition giving ``value`` says it is the total."""
    if not lines or not hasattr(value, "lineno"):
        return False
    last = getattr(value, "end_lineno", value.lineno) or value.lineno
    return any(
        GLOBAL_COMMENT.search(lines[number - 1])
        for number in range(value.lineno, last + 1)
        if 0 < number <= len(lines)
    )
