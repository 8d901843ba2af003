"""A batch written as a product of numbers (``dataset.batch(32 * 4)``), found in the
user's source: one factor is most likely a device count written by hand.

The run-time batching check reads the batch size (128) from the dataset, and the code
that made it from the user's file: the batch call whose argument is a product of integer
literals equal to that size. Scaling such a product by the replica count would multiply
twice (``32 * 4 * strategy.num_replicas_in_sync``); the fix replaces the hand-written
count instead. Pure ``ast``: nothing is imported or run.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass

# Dataset methods whose first argument (or ``batch_size=``) is the batch size.
_BATCH_METHODS = frozenset({"batch", "padded_batch", "ragged_batch", "rebatch"})


@dataclass(frozen=True)
class LiteralProduct:
    """``32 * 4`` as written: its text, factors (in order), line (1-based) and the
    file's path (None until the caller says which file the source came from)."""

    text: str
    factors: tuple[int, ...]
    line: int
    path: str | None = None

    @property
    def value(self) -> int:
        return math.prod(self.factors)

    def count_factor(self, replicas: int) -> int:
        """The factor taken as the hand-written replica count: one equal to
        ``replicas`` if any (the last such), else the last factor."""
        equal = [factor for factor in self.factors if factor == replicas]
        return equal[-1] if equal else self.factors[-1]

    def scaled_text(self, replicas: int) -> str:
        """The product with its count factor replaced by
        ``strategy.num_replicas_in_sync``: ``32 * strategy.num_replicas_in_sync``."""
        count = self.count_factor(replicas)
        rest = list(self.factors)
        del rest[len(rest) - 1 - rest[::-1].index(count)]
        return " * ".join([*map(str, rest), "strategy.num_replicas_in_sync"])


def _product(node: ast.expr) -> tuple[int, ...] | None:
    """The integer factors of ``a * b * ...`` (literals only), else None."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        left, right = _product(node.left), _product(node.right)
        return None if left is None or right is None else left + right
    if isinstance(node, ast.Constant) and type(node.value) is int and node.value > 0:
        return (node.value,)
    return None


def _as_product(node: ast.expr | None) -> LiteralProduct | None:
    factors = _product(node) if node is not None else None
    if factors is None or len(factors) < 2:
        return None
    return LiteralProduct(ast.unparse(node), factors, node.lineno)


def _argument(call: ast.Call, position: int, keyword: str) -> ast.expr | None:
    for item in call.keywords:
        if item.arg == keyword:
            return item.value
    return call.args[position] if len(call.args) > position else None


def _calls(source: str):
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):  # not Python we can read: nothing to say
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield node


def dataset_batch_products(
    source: str, size: int, lines: tuple[int, int] | None = None
) -> list[LiteralProduct]:
    """The batch calls of ``source`` (``.batch(32 * 4)``, ``.padded_batch(...)``) whose
    batch size is a product of integer literals equal to ``size``, in line order; only
    those starting within ``lines`` (first, last; 1-based, inclusive) when given.

    Example:

    ```python
    >>> from keras_dp_tools.checks.literal_batch import dataset_batch_products
    >>> [p.text for p in dataset_batch_products("ds = ds.batch(32 * 4)", 128)]
    ['32 * 4']

    ```
    """
    found = []
    for call in _calls(source):
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr in _BATCH_METHODS:
            product = _as_product(_argument(call, 0, "batch_size"))
            inside = lines is None or lines[0] <= call.lineno <= lines[1]
            if product is not None and product.value == size and inside:
                found.append(product)
    return sorted(found, key=lambda product: product.line)


def fit_batch_product(source: str, line: int, size: int) -> LiteralProduct | None:
    """The ``batch_size=32 * 4`` of the ``fit`` call spanning ``line`` of ``source``,
    when it is a product of integer literals equal to ``size``; else None.

    Example:

    ```python
    >>> from keras_dp_tools.checks.literal_batch import fit_batch_product
    >>> fit_batch_product("model.fit(x, y, batch_size=16 * 2)", 1, 32).factors
    (16, 2)

    ```
    """
    for call in _calls(source):
        func = call.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name != "fit" or not call.lineno <= line <= (call.end_lineno or call.lineno):
            continue
        keyword = next((item.value for item in call.keywords if item.arg == "batch_size"), None)
        product = _as_product(keyword)
        if product is not None and product.value == size:
            return product
    return None
