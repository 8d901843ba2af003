"""Error messages made fit for one line of a table or a progress print.

A trial's failure reaches the user as a table's ``reason``: Keras colours parts of its
messages with terminal escapes and quotes the call's arguments below them, and a
``tf.function``'s error quotes the user's traceback before the exception's own line.
Standard library only, so every layer may import it.
"""

from __future__ import annotations

import re

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# Where a message starts to quote a traceback: the exception lines after it are quoted.
_TRACEBACK = re.compile(
    r"Traceback \(most recent call last\)|in user code:|most recent call last\):"
)
_FILE_LINE = re.compile(r'^\s*File "')
# An exception's own line inside a quoted traceback ("    ValueError: ...").
_EXCEPTION_LINE = re.compile(r"^\s*(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit):\s")
# Keras's "Arguments received by Layer.call(): • inputs=..." block says nothing of the cause.
_KERAS_ARGUMENTS = re.compile(r"\n\s*Arguments received by [^\n]*(?:\n\s*•[^\n]*)*")


def without_escapes(text: str) -> str:
    """``text`` without terminal colour and cursor escapes.

    Args:
        text: a message, perhaps coloured for a terminal.

    Returns:
        The text, escapes removed.

    Example:

    >>> from keras_dp_tools.common.text import without_escapes
    >>> without_escapes("\\x1b[1mbold\\x1b[0m")
    'bold'
    """
    return _ANSI.sub("", text)


def shortened(text: str, limit: int) -> str:
    """``text`` on one line, cut at the last word that fits.

    Args:
        text: any text; runs of whitespace (newlines too) become one space.
        limit: the most characters to return, the ellipsis included.

    Returns:
        The text, with an ellipsis where it was cut.

    Example:

    >>> from keras_dp_tools.common.text import shortened
    >>> shortened("Out of memory\\n  while allocating a tensor", 20)
    'Out of memory while…'
    """
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    cut = flat[: limit - 1]
    if flat[limit - 1] != " ":  # the cut fell inside a word: leave that word out
        cut = cut.rsplit(" ", 1)[0]
    return cut.rstrip(" ,;:") + "…"


def _cause(lines: list[str]) -> list[str]:
    """Of a message that quotes a traceback, the lines that state the cause: the last
    exception line quoted after the traceback starts (a tf.function's "in user code:"),
    else what follows the last quoted frame (TensorFlow's "Graph execution error: ...
    defined at (most recent call last): File ... <cause>"), after the message's first line."""
    start = next((i for i, line in enumerate(lines) if _TRACEBACK.search(line)), None)
    if start is None:
        return lines
    quoted = [i for i in range(start + 1, len(lines)) if _EXCEPTION_LINE.match(lines[i])]
    if quoted:
        return lines[quoted[-1] :]
    frames = [i for i in range(start + 1, len(lines)) if _FILE_LINE.match(lines[i])]
    after = lines[frames[-1] + 1 :] if frames else []
    cause = next((line for line in after if line.strip() and not line[0].isspace()), None)
    return [lines[0], cause] if cause else lines


def error_reason(error: BaseException | str, limit: int = 300) -> str:
    """A failure in one line: ``Type: message`` from the start of the message (its
    cause comes first), without escapes or Keras's quoted arguments; of a message that
    quotes a traceback, the last exception line quoted in it.

    Args:
        error: the exception, or a reason already written as ``Type: message``.
        limit: the most characters to keep.

    Returns:
        The reason in one line.

    Example:

    ```python
    from keras_dp_tools.common.text import error_reason

    print(error_reason(ValueError("\\x1b[1mYou must specify an aggregation method\\x1b[0m")))
    # ValueError: You must specify an aggregation method
    ```
    """
    text = str(error)
    if isinstance(error, BaseException):
        text = f"{type(error).__name__}: {text}"
    text = _KERAS_ARGUMENTS.sub("", without_escapes(text))
    return shortened("\n".join(_cause(text.splitlines())), limit).rstrip(": ")
