"""Stated intent: what the code says a batch size is, read both ways.

A value reads as **per replica** (a constant there is the mistake, whatever else is said)
when its name or a comment on or above its definition says so: ``PER_CORE_BATCH``,
``batch_size_per_replica``, "# this is the per-core batch size. The global batch size is 8x
this", "# batch size on each GPU", "# for each of the 8 TPU cores".

Otherwise it reads as **global** (not the mistake) when
- its name says so (``global_batch_size``, ``GLOBAL_BATCH``, ``total_batch``,
  ``EFFECTIVE_BATCH_SIZE``);
- the code divides it by the replica, core or worker count
  (``batch_size // strategy.num_replicas_in_sync``), asks an input context for its
  per-replica share (``get_per_replica_batch_size(batch_size)``), gives it as the
  ``global_batch_size`` of ``tf.nn.compute_average_loss`` (or averages a summed loss over
  it: ``tf.reduce_sum(loss) / BATCH``, ``loss * (1.0 / BATCH)``), or checks that it
  divides (``assert batch_size % 8 == 0``, ``if BATCH % num_workers: raise ...``), also
  held on an attribute (``if FLAGS.batch_size % len(gpus): raise ...``);
- a comment on its definition, or on the comment lines right above it, says it is the
  total ("# global batch", "# must be divisible by the number of workers", "# for all 8
  TPU cores", "# 16 x 8 cores");
- it is written as a product of numbers (``4096 * 9``) or multiplied by a replica, core or
  worker count (``PER_WORKER_BATCH * NUM_WORKERS``): ``flow.py`` reads those.
"""

from __future__ import annotations

import ast
import re

GLOBAL_NAME = re.compile(r"(?i)global|total|effective")
_UNITS = r"(replica|core|tpu|device|gpu|worker|shard|host|chip|accelerator)s?"
# "8 TPU cores", "the GPUs", "all replicas": a count of units, as comments write it.
_COUNTED = r"(the )?(\d+ )?((tpu|gpu|v\d+) )?(replicas|devices|gpus|cores|workers|tpus|chips)"
PER_REPLICA_NAME = re.compile(rf"(?i)(per_?|each_?){_UNITS}|{_UNITS}_?batch")
PER_REPLICA_COMMENT = re.compile(
    rf"(?i)\b(per[- ]?{_UNITS}|(for|on|to|of) (each|every|one|a single) {_UNITS}"
    rf"|each {_UNITS}|each of {_COUNTED}|{_UNITS} batch)\b"
)
GLOBAL_COMMENT = re.compile(
    r"(?i)\b(global|total|in all|effective batch"
    rf"|across (all )?{_COUNTED}|(for |over )?all {_COUNTED}"
    r"|divisible by|split (across|over|among|between)|divided (among|across|over|between)"
    r"|(number|count) of (replicas|devices|gpus|cores|workers|tpus)"
    r"|(all )?in (one|a single) batch)\b"
    r"|%\s*\w+\s*==\s*0"  # batch_size % 8 == 0: it must divide
    rf"|\b\d+ {_COUNTED} ?[x*×]|(?<![A-Za-z_])[x*×] ?\d+ {_COUNTED}\b"  # "16 * 8 cores"
)
# Names of a replica, core, device or worker count.
COUNT_NAME = re.compile(
    r"(?i)^(num_?|n_?|total_?)?(replica|core|tpu_core|tpu|gpu|device|worker|shard|"
    r"accelerator|chip)s?(_count|_in_sync|_num|_per_host)?$|^world_size$"
)
COMMENT_LINES_ABOVE = 4  # comment lines above a definition read for its intent
HINT = (
    "If it is meant as the global batch, say so: name it so (GLOBAL_BATCH_SIZE) or write "
    "'# global batch' on its definition."
)
GLOBAL, PER_REPLICA = "global", "per replica"


def named(name: str) -> str | None:
    """The intent a name states, if any."""
    if PER_REPLICA_NAME.search(name):
        return PER_REPLICA
    return GLOBAL if GLOBAL_NAME.search(name) else None


def says_global(name: str) -> bool:
    return named(name) == GLOBAL


def is_count(node) -> bool:
    """Whether ``node`` is (or uses) a replica, core, device or worker count."""
    for part in ast.walk(node):
        if isinstance(part, ast.Attribute) and (
            part.attr == "num_replicas_in_sync" or COUNT_NAME.match(part.attr)
        ):
            return True
        if isinstance(part, ast.Name) and COUNT_NAME.match(part.id):
            return True
    return False


def _checked_divisible(node: ast.BinOp) -> bool:
    """``batch % n`` as the code checks that a total divides: ``n`` a count or a number."""
    return isinstance(node.op, ast.Mod) and (
        is_count(node.right)
        or (isinstance(node.right, ast.Constant) and isinstance(node.right.value, int))
    )


def _held(node) -> str | None:
    """How a batch size is held, as written: ``batch_size``, ``FLAGS.batch_size``,
    ``self.cfg.batch_size``; None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and _held(node.value) is not None:
        return ast.unparse(node)
    return None


def _loss_over(node) -> bool:
    """A summed loss (or 1) divided by a batch size: the code averages over the global
    batch, as a replica's loss must be under a strategy."""
    if not (
        isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Div)
        and _held(node.right) is not None
        and "batch" in _held(node.right).split(".")[-1].lower()
    ):
        return False
    left = node.left
    if isinstance(left, ast.Constant) and left.value == 1:
        return True
    return any(
        isinstance(part, ast.Call) and ast.unparse(part.func).endswith("reduce_sum")
        for part in ast.walk(left)
    )


def divided_names(tree: ast.Module) -> set[str]:
    """Names (and attributes, as written: ``FLAGS.batch_size``) the code treats as a
    total to share out over replicas."""
    names = set()
    tests = [
        part
        for node in ast.walk(tree)
        if isinstance(node, (ast.Assert, ast.If))
        for part in ast.walk(node.test)
    ]
    for node in tests:
        if isinstance(node, ast.BinOp) and _held(node.left) and _checked_divisible(node):
            names.add(_held(node.left))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, (ast.Div, ast.FloorDiv))
            and _held(node.left)
            and is_count(node.right)
        ):
            names.add(_held(node.left))
        elif _loss_over(node):  # tf.reduce_sum(loss) / BATCH, loss * (1.0 / BATCH)
            names.add(_held(node.right))
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            given = [*node.args[:1]] if name == "get_per_replica_batch_size" else []
            given += [k.value for k in node.keywords if k.arg == "global_batch_size"]
            names.update(_held(value) for value in given if _held(value))
    return names


def _comments(lines: list[str], value: ast.expr) -> list[str]:
    """The comments on the lines of ``value`` and the comment lines right above it."""
    last = getattr(value, "end_lineno", value.lineno) or value.lineno
    found = [
        lines[number - 1].split("#", 1)[1]
        for number in range(value.lineno, last + 1)
        if 0 < number <= len(lines) and "#" in lines[number - 1]
    ]
    number = value.lineno - 1
    while number > 0 and value.lineno - number <= COMMENT_LINES_ABOVE:
        text = lines[number - 1].strip()
        if not text.startswith("#"):
            break
        found.append(text.lstrip("#"))
        number -= 1
    return found


def commented(lines: list[str] | None, value: ast.expr) -> str | None:
    """The intent the comments on (or right above) the definition giving ``value`` state."""
    if not lines or not hasattr(value, "lineno"):
        return None
    comments = _comments(lines, value)
    if any(PER_REPLICA_COMMENT.search(comment) for comment in comments):
        return PER_REPLICA
    if any(GLOBAL_COMMENT.search(comment) for comment in comments):
        return GLOBAL
    return None
