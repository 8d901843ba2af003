"""ReplayReader: plays back a recorded stream of GPU readings through the reader interface.

Used to drive the monitor, its step alignment and its reports without a GPU (tests,
demos), and to re-run the analysis on readings recorded elsewhere.
"""

from __future__ import annotations

import json
import os
import time

from keras_dp_tools.capture.monitor.nvml_reader import GpuDevice


class ReplayReader:
    """Implements ``NvmlReader``'s ``open`` / ``read`` / ``close`` from a recorded stream.

    Each recorded reading has ``offset_s`` (seconds from the stream's start), ``gpu``
    and any reading fields (``util_gpu``, ``mem_used_gb``, ...). After ``open``, each
    ``read`` returns the readings whose offset has passed and that were not returned yet,
    stamped with ``time`` = open time + offset, as a live reader would.

    Args:
        readings: the stream, or a path to a JSON Lines file of it.
        names: GPU names to report (default "replayed GPU <i>").

    Example:

    >>> from keras_dp_tools.capture.monitor.replay import ReplayReader
    >>> reader = ReplayReader([{"offset_s": 0.0, "gpu": 0, "util_gpu": 97.0},
    ...                        {"offset_s": 3600.0, "gpu": 0, "util_gpu": 12.0}])
    >>> [device.name for device in reader.open()]
    ['replayed GPU 0']
    >>> [reading["util_gpu"] for reading in reader.read()]  # the second is an hour away
    [97.0]
    """

    def __init__(self, readings, names: dict[int, str] | None = None):
        if isinstance(readings, (str, os.PathLike)):
            with open(readings, encoding="utf-8") as stream:
                readings = [json.loads(line) for line in stream if line.strip()]
        self.readings = sorted(readings, key=lambda reading: reading["offset_s"])
        self.names = names or {}
        self.devices: list[GpuDevice] = []
        self._started: float | None = None
        self._next = 0

    def open(self) -> list[GpuDevice]:
        self._started = time.time()
        self._next = 0
        gpus = sorted({int(reading["gpu"]) for reading in self.readings})
        self.devices = [
            GpuDevice(gpu, gpu, self.names.get(gpu, f"replayed GPU {gpu}"), "", "") for gpu in gpus
        ]
        return self.devices

    def read(self) -> list[dict]:
        elapsed = time.time() - self._started
        due = []
        while self._next < len(self.readings) and self.readings[self._next]["offset_s"] <= elapsed:
            reading = dict(self.readings[self._next])
            offset = reading.pop("offset_s")
            due.append({"sampling": "poll", **reading, "time": self._started + offset})
            self._next += 1
        return due

    def close(self) -> None:
        self._started = None
