"""Host CPU usage: how busy this process and the machine were, without extra packages."""

from __future__ import annotations

import os
import time

from keras_dp_tools.common.cores import usable_cores


def _system_cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs from /proc/stat; None where it does not exist."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            values = [int(value) for value in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return sum(values) - idle, sum(values)


class HostCpuMeter:
    """CPU usage between successive ``read`` calls.

    ``process_cpu_percent`` is this process's CPU time over wall time (100 = one core
    busy); ``system_cpu_percent`` the whole machine's busy share (Linux only, else None);
    ``cpu_count`` the cores this process may run on (``common.cores.usable_cores``).

    Example:

    >>> from keras_dp_tools.capture.monitor.host_usage import HostCpuMeter
    >>> meter = HostCpuMeter()
    >>> usage = meter.read()  # since the meter was made
    >>> sorted(usage)
    ['cpu_count', 'process_cpu_percent', 'system_cpu_percent', 'time']
    """

    def __init__(self):
        self.cpu_count = usable_cores()  # those it may use: the ones it competes for
        self._previous = self._now()

    @staticmethod
    def _now():
        times = os.times()
        return time.monotonic(), times.user + times.system, _system_cpu_times()

    def read(self) -> dict:
        """Usage since the previous read (or since construction)."""
        previous, current = self._previous, self._now()
        self._previous = current
        wall = current[0] - previous[0]
        process = 100.0 * (current[1] - previous[1]) / wall if wall > 0 else None
        system = None
        if previous[2] and current[2] and current[2][1] > previous[2][1]:
            busy = current[2][0] - previous[2][0]
            system = 100.0 * busy / (current[2][1] - previous[2][1])
        return {
            "time": time.time(),
            "process_cpu_percent": process,
            "system_cpu_percent": system,
            "cpu_count": self.cpu_count,
        }
