"""Builds XSpace protos with the schema the TensorFlow profiler writes, for analysis tests
and the benchmarks' synthetic traces.

Times are given in milliseconds (``event``) or picoseconds (``event_ps``, the path for
traces of a million events) and stored as the profiler stores them: a line's
``timestamp_ns`` plus each event's ``offset_ps`` and ``duration_ps``. Stats are typed by
their value: ``int`` an int64, ``str`` a string, ``Uint`` a uint64, ``Ref`` a reference
to the stat metadata named by the string (how CUPTI's ``kernel_details`` are stored).
"""

from __future__ import annotations

from pathlib import Path

MS = 1_000_000_000  # picoseconds per millisecond
LINE_START_NS = 1_700_000_000_000_000_000  # lines start at a Unix time, as in real traces


class Uint(int):
    """A stat value stored as ``uint64_value``."""


class Ref(str):
    """A stat value stored as ``ref_value``: the id of the stat metadata of this name."""


class PlaneBuilder:
    def __init__(self, space, name: str, plane_id: int):
        self.plane = space.planes.add(id=plane_id, name=name)
        self._events: dict[str, int] = {}
        self._stats: dict[str, int] = {}
        self._lines: dict[str, object] = {}

    def stat_id(self, name: str) -> int:
        """The stat metadata id of ``name``, created on first use (ids 1, 2, ...)."""
        if name not in self._stats:
            stat_id = len(self._stats) + 1
            self.plane.stat_metadata[stat_id].id = stat_id
            self.plane.stat_metadata[stat_id].name = name
            self._stats[name] = stat_id
        return self._stats[name]

    def event_id(self, name: str) -> int:
        """The event metadata id of ``name``, created on first use (ids 1, 2, ...)."""
        if name not in self._events:
            event_id = len(self._events) + 1
            self.plane.event_metadata[event_id].id = event_id
            self.plane.event_metadata[event_id].name = name
            self._events[name] = event_id
        return self._events[name]

    def line(self, name: str, line_id: int | None = None):
        """The XLine named ``name``, created on first use with ``line_id`` (default: the
        next number), starting at ``LINE_START_NS``."""
        if name not in self._lines:
            number = len(self._lines) + 1 if line_id is None else line_id
            self._lines[name] = self.plane.lines.add(
                id=number, name=name, timestamp_ns=LINE_START_NS
            )
        return self._lines[name]

    def rename_line(self, name: str, new_name: str) -> None:
        line = self._lines.pop(name)
        line.name = new_name
        self._lines[new_name] = line

    def event(self, line: str, name: str, start_ms: float, end_ms: float, **stats):
        """Adds an event on ``line`` (created on first use) with typed stats."""
        duration_ps = round((end_ms - start_ms) * MS)
        self.event_ps(line, name, round(start_ms * MS), duration_ps, **stats)
        return self

    def event_ps(self, line: str, name: str, offset_ps: int, duration_ps: int, **stats):
        """``event`` in picoseconds from the line's start; returns the XEvent."""
        line_proto = self._lines.get(line)
        if line_proto is None:
            line_proto = self.line(line)
        event = line_proto.events.add(
            metadata_id=self._events.get(name) or self.event_id(name),
            offset_ps=offset_ps,
            duration_ps=duration_ps,
        )
        for key, value in stats.items():
            stat = event.stats.add(metadata_id=self._stats.get(key) or self.stat_id(key))
            if isinstance(value, Ref):
                stat.ref_value = self.stat_id(value)
            elif isinstance(value, Uint):
                stat.uint64_value = value
            elif isinstance(value, str):
                stat.str_value = value
            else:
                stat.int64_value = value
        return event


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
        duration_ps = round((end_ms - start_ms) * MS)
        return self.step_ps(step, round(start_ms * MS), duration_ps, own)

    def step_ps(self, step: int, offset_ps: int, duration_ps: int, own: bool = True):
        """``step`` in picoseconds."""
        stats = {"step_num": step, "_r": 1, **({"kdp": 1} if own else {})}
        self.host().event_ps("python", "train", offset_ps, duration_ps, **stats)
        return self

    def save(self, path: Path) -> Path:
        """Writes the XSpace to ``path`` (its folder created)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.space.SerializeToString())
        return path

    def write(self, directory: Path, capture: str = "2026_11_29_10_00_00") -> Path:
        """Writes the XSpace where the profiler would, under ``directory``."""
        return self.save(directory / "plugins" / "profile" / capture / "testhost.xplane.pb")
