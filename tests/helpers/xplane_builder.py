"""Builds XSpace protos with the schema the TensorFlow profiler writes, for analysis tests.

Times are given in milliseconds and stored as the profiler stores them: a line's
``timestamp_ns`` plus each event's ``offset_ps`` and ``duration_ps``.
"""

from __future__ import annotations

from pathlib import Path

MS = 1_000_000_000  # picoseconds per millisecond
LINE_START_NS = 1_700_000_000_000_000_000  # lines start at a Unix time, as in real traces


class PlaneBuilder:
    def __init__(self, space, name: str, plane_id: int):
        self.plane = space.planes.add(id=plane_id, name=name)
        self._events: dict[str, int] = {}
        self._stats: dict[str, int] = {}
        self._lines: dict[str, object] = {}

    def _stat_id(self, name: str) -> int:
        if name not in self._stats:
            stat_id = len(self._stats) + 1
            self.plane.stat_metadata[stat_id].id = stat_id
            self.plane.stat_metadata[stat_id].name = name
            self._stats[name] = stat_id
        return self._stats[name]

    def _event_id(self, name: str) -> int:
        if name not in self._events:
            event_id = len(self._events) + 1
            self.plane.event_metadata[event_id].id = event_id
            self.plane.event_metadata[event_id].name = name
            self._events[name] = event_id
        return self._events[name]

    def event(self, line: str, name: str, start_ms: float, end_ms: float, **stats):
        """Adds an event on ``line`` (created on first use) with int or str stats."""
        if line not in self._lines:
            self._lines[line] = self.plane.lines.add(
                id=len(self._lines) + 1, name=line, timestamp_ns=LINE_START_NS
            )
        event = self._lines[line].events.add(
            metadata_id=self._event_id(name),
            offset_ps=round(start_ms * MS),
            duration_ps=round((end_ms - start_ms) * MS),
        )
        for key, value in stats.items():
            stat = event.stats.add(metadata_id=self._stat_id(key))
            if isinstance(value, str):
                stat.str_value = value
            else:
                stat.int64_value = value
        return self


class SpaceBuilder:
    """``SpaceBuilder().host()`` / ``.gpu(n)`` give plane builders; ``.write(dir)``."""

    def __init__(self):
        from tensorflow.tsl.profiler.protobuf import xplane_pb2

        self.space = xplane_pb2.XSpace()
        self._planes: dict[str, PlaneBuilder] = {}

    def plane(self, name: str) -> PlaneBuilder:
        if name not in self._planes:
            self._planes[name] = PlaneBuilder(self.space, name, len(self._planes) + 1)
        return self._planes[name]

    def host(self) -> PlaneBuilder:
        return self.plane("/host:CPU")

    def gpu(self, ordinal: int) -> PlaneBuilder:
        return self.plane(f"/device:GPU:{ordinal}")

    def step(self, step: int, start_ms: float, end_ms: float, own: bool = True):
        """A step marker as ``Trace("train", step_num=step, _r=1[, kdp=1])`` leaves it."""
        stats = {"step_num": step, "_r": 1, **({"kdp": 1} if own else {})}
        self.host().event("python", "train", start_ms, end_ms, **stats)
        return self

    def write(self, directory: Path, capture: str = "2026_11_29_10_00_00") -> Path:
        path = directory / "plugins" / "profile" / capture / "testhost.xplane.pb"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.space.SerializeToString())
        return path
