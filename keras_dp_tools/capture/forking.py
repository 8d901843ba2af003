"""What a child forked from a training process does with what it inherited.

Our at-fork handlers run in every child forked from a training process (a data
loader's workers too), where the parent's recorders, writers and fits must fall
silent. TensorFlow is not fork-safe: freeing, in the child, an object that holds
TensorFlow state (a record writer, an exception whose traceback holds tensors) can
crash the child. So the handlers never free what the parent made; they set it aside.
"""

from __future__ import annotations

_SET_ASIDE: list = []


def set_aside(*objects) -> None:
    """Keeps ``objects`` (and all they reference) alive while the process runs (until
    the interpreter finalizes, which multiprocessing's children, leaving through
    ``os._exit``, never do).

    Args:
        *objects: what must not be freed (and finalized) in this process.
    """
    _SET_ASIDE.extend(objects)
