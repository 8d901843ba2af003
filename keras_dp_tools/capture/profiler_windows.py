"""The live profilers of this process, for the callbacks that must know whether a step
was disturbed by profiling (``StepTimer`` keeps those steps apart).

A profiler registers itself when its ``fit`` begins; ``profiling_disturbs`` asks the
registered ones. Kept apart from the profiler so a callback that asks does not reach
into the profiler's module.
"""

from __future__ import annotations

import os
import weakref
from pathlib import Path
from typing import Protocol


class LiveProfiler(Protocol):
    """What the registry asks of a profiler."""

    log_dir: object

    @property
    def busy(self) -> bool:
        """Whether a window is captured or an analysis is pending."""

    def disturbing(self, started: float) -> bool:
        """Whether a step that started at ``started`` (``time.time()``) is slowed."""


# Profilers of this process, held weakly: a profiler no longer used is forgotten.
_profilers: weakref.WeakSet = weakref.WeakSet()
# A fit in a forked child is not disturbed by the parent's profilers.
os.register_at_fork(after_in_child=_profilers.clear)


def register(profiler: LiveProfiler) -> None:
    """Adds ``profiler`` to the ones ``profiling_disturbs`` asks (held weakly).

    Args:
        profiler: a live profiler of this process (``DataParallelProfiler``).
    """
    _profilers.add(profiler)


def profiling_disturbs(log_dir, started: float) -> bool:
    """Whether a profiler of this process on ``log_dir`` disturbs a step that started at
    ``started`` (the steps it overlaps are the ``profiled`` ones of ``kdt.Report``).

    Args:
        log_dir: the run folder of the step's timer.
        started: when the step started (``time.time()``).

    Returns:
        True when a busy profiler on the same folder overlaps the step.
    """
    # StepTimer asks twice a step: the weak references themselves, not the WeakSet's
    # iterator (Python code), and a profiler with no window and no analysis is idle.
    busy = []
    for reference in tuple(_profilers.data):
        profiler = reference()
        if profiler is None or not profiler.busy:
            continue
        if profiler.disturbing(started):
            busy.append(profiler)
    if not busy:  # resolving paths costs ~0.1 ms
        return False
    where = Path(log_dir).resolve()
    return any(Path(profiler.log_dir).resolve() == where for profiler in busy)
