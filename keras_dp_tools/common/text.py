"""Error messages made fit for one line of a table or a progress print.

A trial's failure reaches the user as a table's ``reason``: Keras colours parts of its
messages with terminal escapes and quotes the call's arguments below them, and a
``tf.function``'s error quotes the user's traceback before the exception's own line.
Standard library only, so every layer may import it.
"""

from __future__ import annotations

import re

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# An exception's own line inside a quoted traceback ("    ValueError: ...").
_EXCEPTION_LINE = re.compile(r"^\s*(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit):\s")
# Keras's "Arguments received by Layer.call(): • inputs=..." block says nothing of the cause.
_KERAS_ARGUMENTS = re.compile(r"\n\s*Arguments received by .*", re.DOTALL)


def without_escapes(text: str) -> str:
    """``text`` without terminal colour and cursor escapes."""
    return _ANSI.sub("", text)


def shortened(text: str, limit: int) -> str:
    """``text`` on one line (runs of whitespace as one space), cut at the last word
    that fits ``limit`` characters, with an ellipsis where it was cut."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    cut = flat[: limit - 1].rsplit(" ", 1)[0]
    return cut.rstrip(" ,;:") + "…"


def error_reason(error: BaseException | str, limit: int = 300) -> str:
    """A failure in one line: ``Type: message`` from the start of the message (its
    cause comes first), without escapes or Keras's quoted arguments; of a message that
    quotes a traceback, the last exception line quoted in it.

    Args:
        error: the exception, or a reason already written as ``Type: message``.
        limit: the most characters to keep.

    Example:

    ```python
    from keras_dp_tools.common.text import error_reason

    print(error_reason(ValueError("\\x1b[1mYou must specify an aggregation method\\x1b[0m")))
    # ValueError: You must specify an aggregation method
    ```
    """
    text = str(error)
    if isinstance(error, BaseException):
        text = f"{type(error).__name__}: {text}" if text else type(error).__name__
    text = _KERAS_ARGUMENTS.sub("", without_escapes(text))
    lines = text.splitlines()
    quoted = [index for index, line in enumerate(lines) if _EXCEPTION_LINE.match(line)]
    if quoted and quoted[-1] > 0:
        text = "\n".join(lines[quoted[-1] :])
    return shortened(text, limit)
