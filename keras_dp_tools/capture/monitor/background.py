"""Background threads that yield the CPU to training."""

from __future__ import annotations

import contextlib
import os
import threading

NICE = 10


def lower_thread_priority(nice: int = NICE) -> None:
    """Lowers the calling thread's scheduling priority (Linux schedules threads one by
    one), so our analysis and sampling yield CPU time to training ops on busy machines.
    Does nothing where that is not supported.

    Args:
        nice: the niceness to add (higher yields more).
    """
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
