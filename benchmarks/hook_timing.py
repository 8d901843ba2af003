"""HookTimer: the time a fit spends inside some callbacks' hooks.

Whole-``fit`` wall times of two runs differ by more than a callback's cost on a busy
machine; the time spent inside the callback's own hooks, divided by the step time of
the same run, does not depend on what the neighbours do. ``make bench`` and
``benchmarks/hooks_ab.py`` report our callbacks' overhead that way. A benchmark's
instrument, not part of the package: import it from the checkout's root
(``benchmarks.hook_timing``).
"""

from __future__ import annotations

import time
from collections import defaultdict

from keras_dp_tools.capture.base import HOOKS

BATCH_HOOKS = ("on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end")


class HookTimer:
    """Wraps the hooks the given callbacks implement and adds up their time.

    Per hook name: ``wall_s`` (``time.perf_counter``), ``cpu_s`` (``time.thread_time``
    of the calling thread: what the hook itself computed, not time it was preempted)
    and ``calls``. Only hooks a callback overrides are wrapped, so Keras still skips
    the others (and tf_keras still decides whether to call batch hooks at all) as it
    would without the timer. Time the callbacks spend in threads of their own is not
    included.

    Example:

    ```python
    import keras_dp_tools as kdt
    from benchmarks.hook_timing import HookTimer

    callbacks = kdt.callbacks("logs/run1")
    timer = HookTimer(callbacks)
    model.fit(x, y, callbacks=callbacks)
    print(timer.batch_wall_s / timer.steps * 1e3, "ms per step in our batch hooks")
    ```

    Args:
        callbacks: the callback objects to time (their hooks are replaced on the
            instances; ``restore()`` puts the originals back).
    """

    def __init__(self, callbacks):
        self.wall_s: dict[str, float] = defaultdict(float)
        self.cpu_s: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        # Per train-function call: time in its batch hooks (begin and end).
        self.per_step_wall_s: list[float] = []
        self.per_step_cpu_s: list[float] = []
        self._batch = self._end_batch = None
        self._ended = True
        self._wrapped: list[tuple[object, str]] = []
        for callback in callbacks:
            for name in HOOKS:
                hook = getattr(callback, name, None)
                if hook is None or getattr(hook, "_is_default", False):
                    continue
                setattr(callback, name, self._timed(name, hook))
                self._wrapped.append((callback, name))

    def _timed(self, name: str, hook):
        wall_s, cpu_s, calls = self.wall_s, self.cpu_s, self.calls
        perf_counter, thread_time = time.perf_counter, time.thread_time
        in_batch, begins = name in BATCH_HOOKS, name.endswith("batch_begin")

        def timed_hook(*args, **kwargs):
            wall, cpu = perf_counter(), thread_time()
            try:
                return hook(*args, **kwargs)
            finally:
                used = thread_time() - cpu
                elapsed = perf_counter() - wall
                cpu_s[name] += used
                wall_s[name] += elapsed
                calls[name] += 1
                if in_batch:
                    self._add_to_step(args[0] if args else None, begins, elapsed, used)

        return timed_hook

    def _add_to_step(self, batch, begins: bool, elapsed: float, used: float) -> None:
        # A begin hook after end hooks starts the next call; so does an end hook with a
        # new batch number right after end hooks (callbacks with end hooks only).
        if begins:
            new_call = self._ended or batch != self._batch
            self._batch = batch
        else:
            new_call = self._ended and batch != self._end_batch
            self._end_batch = batch
        if new_call or not self.per_step_wall_s:
            self.per_step_wall_s.append(0.0)
            self.per_step_cpu_s.append(0.0)
        self.per_step_wall_s[-1] += elapsed
        self.per_step_cpu_s[-1] += used
        self._ended = not begins

    @property
    def steps(self) -> int:
        """Train-function calls seen (batch hooks of all callbacks count once per call)."""
        return len(self.per_step_wall_s)

    @property
    def batch_wall_s(self) -> float:
        """Wall time in the batch hooks, all calls together."""
        return sum(self.wall_s.get(name, 0.0) for name in BATCH_HOOKS)

    @property
    def batch_cpu_s(self) -> float:
        """Thread CPU time in the batch hooks, all calls together."""
        return sum(self.cpu_s.get(name, 0.0) for name in BATCH_HOOKS)

    @property
    def fixed_wall_s(self) -> float:
        """Wall time in every other hook (train and epoch begin/end, validation)."""
        return sum(t for name, t in self.wall_s.items() if name not in BATCH_HOOKS)

    def restore(self) -> None:
        """Puts the callbacks' own hooks back."""
        for callback, name in self._wrapped:
            vars(callback).pop(name, None)
        self._wrapped = []
