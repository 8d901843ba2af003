"""Warnings that point at the user's line, as Keras's own do.

Our warnings are raised deep inside Keras's callback machinery (``fit`` ->
``CallbackList`` -> our hook) or inside our own helpers. A fixed ``stacklevel`` would
land on a Keras or keras_dp_tools line, which tells the user nothing; Python 3.11 has
no ``skip_file_prefixes``. So the level is computed: the first frame outside these
packages is the user's.
"""

from __future__ import annotations

import contextlib
import sys
import warnings

# Packages whose frames are never the user's line.
_INTERNAL_PACKAGES = frozenset({"keras_dp_tools", "keras", "tf_keras", "tensorflow"})


def _is_internal(frame) -> bool:
    module = frame.f_globals.get("__name__") or ""
    return module.split(".", 1)[0] in _INTERNAL_PACKAGES


def user_frame():
    """The first calling frame outside keras_dp_tools, Keras, tf_keras and TensorFlow:
    the user's line (during ``fit``, the ``fit`` call); None if every frame is inside."""
    frame = sys._getframe(1)
    while frame is not None and _is_internal(frame):
        frame = frame.f_back
    return frame


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn`` attributed to the first calling frame outside keras_dp_tools,
    Keras, tf_keras and TensorFlow (the outermost frame if all of them are inside, e.g.
    on a thread of ours).

    Args:
        message: what the warning says.
        category: its class.

    Example:

    ```python
    from keras_dp_tools.common.warn import warn

    warn("no GPU data; recording CPU usage only")  # shown at the user's fit(...) line
    ```
    """
    frame = sys._getframe(1)
    level = 2  # stacklevel of our caller's frame
    while frame.f_back is not None and _is_internal(frame):
        frame = frame.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)


def warn_without_raising(message: str, category: type[Warning] = UserWarning) -> None:
    """``warn``, for a warning of ours raised where an exception would reach the user's
    ``fit`` (outside a guarded hook) or end a measurement: when the user made warnings
    of ``category`` errors, it is not raised (what it says is recorded elsewhere too).

    Args:
        message: what the warning says.
        category: its class; under ``-W error`` for it, nothing is raised.

    Example:

    ```python
    from keras_dp_tools.common.warn import warn_without_raising

    warn_without_raising("profiling disabled: another profiler session is running")
    ```
    """
    with contextlib.suppress(category):
        warn(message, category)
