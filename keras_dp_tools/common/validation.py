"""Argument checks with errors that say what was received. Standard library only, so
every layer may import it."""

from __future__ import annotations

import numbers


def require_positive_int(name: str, value, error: type[ValueError] = ValueError) -> int:
    """``value`` as an int if it is a positive integer.

    Args:
        name: the argument's name, for the message.
        value: what was received.
        error: the exception to raise (ValueError or a subclass of it).

    Returns:
        ``value`` as an int.

    Raises:
        ValueError: (``error``) ``value`` is not a positive integer; the message names
            the argument and what was received.

    Example:

    >>> from keras_dp_tools.common.validation import require_positive_int
    >>> require_positive_int("steps", 3)
    3
    >>> require_positive_int("steps", 0)
    Traceback (most recent call last):
    ...
    ValueError: steps must be a positive integer, received 0.
    """
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1:
        return int(value)
    raise error(f"{name} must be a positive integer, received {value!r}.")


def require_positive_number(name: str, value, error: type[ValueError] = ValueError) -> float:
    """``value`` as a float if it is a positive number (an int or a float); the
    arguments and the error as for ``require_positive_int``.

    Example:

    >>> from keras_dp_tools.common.validation import require_positive_number
    >>> require_positive_number("interval", 1), require_positive_number("interval", 0.25)
    (1.0, 0.25)
    """
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and value > 0:
        return float(value)
    raise error(f"{name} must be a positive number, received {value!r}.")
