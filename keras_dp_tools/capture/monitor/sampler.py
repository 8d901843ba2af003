"""Sampler: reads a source at a fixed interval in a background thread."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from keras_dp_tools.capture.monitor.background import lower_thread_priority

logger = logging.getLogger("keras_dp_tools")
THREAD_NAME = "keras_dp_gpu_sampler"


class Sampler:
    """Calls ``sink(source.read())`` every ``interval`` seconds in a daemon thread.

    The thread stops on ``stop()``, when ``read`` or ``sink`` raises (reported once
    through ``on_error``), and when nobody called ``heartbeat()`` for ``idle_timeout``
    seconds: a ``fit`` that raised never says it ended, and the sampler must not
    outlive it. ``start()`` after such a stop starts a fresh thread.

    Args:
        source: an object with ``read() -> list[dict]`` (``NvmlReader`` or a replay).
        sink: receives each list of readings.
        interval: seconds between reads.
        idle_timeout: seconds without a heartbeat after which the thread stops; None
            never stops it that way.
        on_error: called with the exception that stopped the thread.

    Example:

    ```python
    from keras_dp_tools.capture.monitor.replay import ReplayReader
    from keras_dp_tools.capture.monitor.sampler import Sampler

    readings = []
    reader = ReplayReader([{"offset_s": 0.0, "gpu": 0, "util_gpu": 97.0}])
    reader.open()
    sampler = Sampler(reader, readings.extend, interval=0.1)
    sampler.start()  # ... training; call sampler.heartbeat() now and then
    sampler.stop()
    ```
    """

    def __init__(
        self,
        source,
        sink: Callable[[list[dict]], None],
        interval: float,
        idle_timeout: float | None = 120.0,
        on_error: Callable[[BaseException], None] | None = None,
    ):
        self.source = source
        self.sink = sink
        self.interval = interval
        self.idle_timeout = idle_timeout
        self.on_error = on_error
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_heartbeat = time.monotonic()
        self.failed = False

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.running or self.failed:
            return
        self.heartbeat()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()

    def heartbeat(self) -> None:
        """Training is alive: keep sampling."""
        self._last_heartbeat = time.monotonic()

    def _run(self) -> None:
        lower_thread_priority()
        stop = self._stop
        while not stop.wait(self.interval):
            if (
                self.idle_timeout is not None
                and time.monotonic() - self._last_heartbeat > self.idle_timeout
            ):
                logger.info("GPU sampler paused: no training step for %.0f s", self.idle_timeout)
                return
            try:
                self.sink(self.source.read())
            except Exception as error:  # never let a reading take the process down
                self.failed = True
                if self.on_error is not None:
                    self.on_error(error)
                return

    def stop(self, timeout: float = 10.0) -> None:
        """Stops the thread and waits for it (a read in progress finishes first)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
