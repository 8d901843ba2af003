"""Handing memory the analysis freed back to the system, where the caller allows it.

The line-sized arrays the trace reading leaves are below glibc's mmap threshold: once
freed, their pages stay in the process unless trimmed. Trimming is right for a process
of its own (the profiler's child analysis, the CLI), not for a thread beside training.
"""

from __future__ import annotations

import functools
from collections.abc import Callable


def memory_release(enabled: bool) -> Callable[[], None]:
    """What the analysis calls between its stages to hand memory freed inside the C
    heap back to the system: glibc's ``malloc_trim`` if ``enabled`` (and glibc is
    there), else nothing. The line-sized arrays the reading leaves are below glibc's
    mmap threshold: once freed, their pages stay in the process (about the size of the
    spans) unless trimmed, and the analysis peaks after. Trimming takes the heap's
    locks and a trimmed page faults back in when reused: right for a process of its
    own, not for a thread beside training (the caller decides: ``release_memory``)."""
    trim = malloc_trim() if enabled else None
    return _keep_memory if trim is None else functools.partial(trim, 0)


def _keep_memory() -> None:
    """Leaves freed memory to the heap, for reuse within the process."""


@functools.cache
def malloc_trim():
    try:
        import ctypes

        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError, TypeError):  # not glibc (musl, macOS, Windows)
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim
