"""Argument checks with errors that say what was received. Standard library only, so
every layer may import it."""

from __future__ import annotations

import numbers


def require_positive_int(name: str, value, error: type[ValueError] = ValueError) -> int:
    """``value`` as an int if it is a positive integer, else a ValueError (``error``, a
    subclass of it) naming it."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1:
        return int(value)
    raise error(f"{name} must be a positive integer, received {value!r}.")


def require_positive_number(name: str, value, error: type[ValueError] = ValueError) -> float:
    """``value`` as a float if it is a positive number, else a ValueError (``error``, a
    subclass of it) naming it."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and value > 0:
        return float(value)
    raise error(f"{name} must be a positive number, received {value!r}.")
