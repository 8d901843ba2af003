"""Reading profiler traces: XSpace protos (``<host>.xplane.pb``) as flat event lists.

The proto classes come from TensorFlow's build (``tensorflow.tsl.profiler.protobuf``);
reading a trace imports them but runs no TensorFlow. Absolute times are picoseconds:
``line.timestamp_ns * 1000 + event.offset_ps``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from keras_dp_tools.analysis.trace.xevents import WireError, read_varint, skip_field, walk_fields
from keras_dp_tools.analysis.trace.xplane_proto import line_header_class, raw_line_class
from keras_dp_tools.analysis.trace.xplane_proto import xplane_pb2 as _xplane_pb2

# The step marker and capture path (keras_dp_tools.records.contract), shared with capture.
from keras_dp_tools.records.contract import (
    OWN_MARKER_STAT,
    PROFILE_SUBDIR,
    STEP_EVENT_NAME,
    TRACE_SUFFIX,
)

HOST_PLANE_PREFIX = "/host:"
GPU_PLANE = re.compile(r"^/device:GPU:(\d+)$")


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One event of a trace: where it ran, what it is called, when, and its stats.
    ``line`` is the line's name (every Python thread's is "python"), ``line_id`` the
    line's id (the thread's)."""

    plane: str
    line: str
    name: str
    start_ps: int
    end_ps: int
    stats: Mapping[str, object] = field(default_factory=dict)
    line_id: int = 0


@dataclass(frozen=True, slots=True)
class StepMarker:
    """A step as marked on the host: ``step`` is the marker's ``step_num``; ``line``
    the name of the thread it was marked on, ``thread`` the thread itself (its plane
    and line id: threads may share a name)."""

    step: int
    start_ps: int
    end_ps: int
    line: str = ""
    thread: tuple[str, int] = ("", 0)


def load_xspace(path: str | os.PathLike):
    """Parses one ``.xplane.pb`` file; raises ValueError naming the file if it is not one."""
    from google.protobuf.message import DecodeError

    path = Path(path)
    space = _xplane_pb2().XSpace()
    try:
        space.ParseFromString(path.read_bytes())
    except DecodeError as error:
        raise ValueError(f"{path} is not an XSpace profile ({error}).") from None
    if not space.planes:
        raise ValueError(f"{path} holds no trace planes: the profiler captured nothing.")
    return space


def stream_xspace(path: str | os.PathLike):
    """An ``XSpace`` read piece by piece, for one pass of the analysis: its planes'
    names, metadata and stats are parsed, their lines are not. Iterating a plane's
    ``lines`` reads them from the file one at a time and yields each as ``XLine``
    messages of at most ~``_GROUP_BYTES`` of events (a long line comes in several,
    each with the line's id, names and timestamp), so the whole trace is never in
    memory at once (a parsed XSpace is ~4x its file). Raises ValueError as
    ``load_xspace`` does; a file this reader cannot walk is parsed whole instead."""
    path = Path(path)
    try:
        with open(path, "rb") as file:
            end = file.seek(0, os.SEEK_END)
            planes = [
                _streamed_plane(path, file, start, stop)
                for number, _, start, stop in _file_fields(file, 0, end)
                if number == _SPACE_PLANES
            ]
    except (WireError, _decode_error()):
        return load_xspace(path)  # raises the parser's own error, or reads what we could not
    if not planes:
        raise ValueError(f"{path} holds no trace planes: the profiler captured nothing.")
    return StreamedSpace(planes)


# Field numbers in xplane.proto.
_SPACE_PLANES, _PLANE_LINES, _LINE_EVENTS = 1, 3, 4
_EVENTS_TAG = _LINE_EVENTS << 3 | 2  # length-delimited: one byte, as the field number < 16
_GROUP_BYTES = 1 << 18  # events parsed at once (~15k small events)


def _decode_error():
    from google.protobuf.message import DecodeError

    return DecodeError


@dataclass(slots=True)
class StreamedSpace:
    """The planes of ``stream_xspace``."""

    planes: list


class StreamedPlane:
    """An ``XPlane`` whose lines stay in the file until ``lines`` is iterated; its
    other fields are those of the parsed plane without lines."""

    __slots__ = ("_lines", "_path", "_plane")

    def __init__(self, plane, path: Path, lines: list[tuple[int, int]]):
        self._plane, self._path, self._lines = plane, path, lines

    def __getattr__(self, name):
        return getattr(self._plane, name)

    @property
    def lines(self) -> Iterator:
        return self._each_line(_line_pieces)

    def whole_lines(self) -> Iterator[LinePiece]:
        """The plane's lines whole (never cut), for readers that decode the events
        from their bytes (``xevents``) and never parse them as messages."""
        return self._each_line(lambda data, path: [_whole_line(data, path)])

    def _each_line(self, read) -> Iterator:
        """``read(data, path)``'s pieces of each line, read from the file in turn."""
        try:
            with open(self._path, "rb") as file:
                for start, stop in self._lines:
                    file.seek(start)
                    data = file.read(stop - start)
                    if len(data) != stop - start:
                        raise WireError("the file ends inside a line")
                    yield from read(data, self._path)
        except (WireError, _decode_error()) as error:
            raise ValueError(f"{self._path} is not an XSpace profile ({error}).") from None


def whole_lines(plane) -> Iterator:
    """A plane's lines, a streamed plane's whole (``StreamedPlane.whole_lines``)."""
    return plane.whole_lines() if isinstance(plane, StreamedPlane) else iter(plane.lines)


class LinePiece:
    """An ``XLine`` of a streamed plane (or a run of its events): its fields read as
    ``XLine``'s, its events parsed as messages only when ``events`` is first read. Its
    serialised bytes (``SerializeToString``) are those read from the file, so a reader
    that decodes the events from the wire format (``xevents``) never parses them."""

    __slots__ = ("_count", "_data", "_events", "_line", "_path", "_whole")

    def __init__(self, data: bytes, line, count: int, path: Path, whole: bool = False):
        self._data, self._line, self._path, self._events = data, line, path, None
        self._count, self._whole = count, whole  # whole: ``line`` holds the events

    def __getattr__(self, name):  # every field but the events: parsed already
        return getattr(self._line, name)

    @property
    def events(self):
        if self._events is None:
            try:
                self._events = _xplane_pb2().XLine.FromString(self._data).events
            except _decode_error() as error:
                raise ValueError(f"{self._path} is not an XSpace profile ({error}).") from None
        return self._events

    def event_count(self) -> int:
        """How many events the piece holds (without parsing them)."""
        return self._count

    def event_bytes(self):
        """Each event's serialised bytes (``raw_line_class``' ``events``)."""
        if self._whole:
            return self._line.events
        return raw_line_class().FromString(self._data).events

    def SerializeToString(self) -> bytes:
        return self._data


def event_count(line) -> int:
    """How many events an ``XLine`` (or a ``LinePiece``, without parsing them) holds."""
    return line.event_count() if isinstance(line, LinePiece) else len(line.events)


def line_timestamps(plane) -> list[int]:
    """``timestamp_ns`` of each line of a plane that holds events. A streamed plane's
    lines' events are skipped (``line_header_class``), not parsed."""
    if not isinstance(plane, StreamedPlane):
        return [line.timestamp_ns for line in plane.lines if len(line.events)]
    timestamps = []
    try:
        with open(plane._path, "rb") as file:
            for start, stop in plane._lines:
                file.seek(start)
                timestamp = _line_timestamp(file.read(stop - start))
                if timestamp is not None:
                    timestamps.append(timestamp)
    except (WireError, _decode_error()) as error:
        raise ValueError(f"{plane._path} is not an XSpace profile ({error}).") from None
    return timestamps


def _line_timestamp(data: bytes) -> int | None:
    """The ``timestamp_ns`` of the line serialised in ``data`` (the last such field
    wins, as protobuf merges; none: 0), None if the line holds no events; parsed (in C)
    without keeping its events (``line_header_class``)."""
    line = line_header_class().FromString(data)
    return line.timestamp_ns if line.HasField("events") else None


def _streamed_plane(path: Path, file, start: int, stop: int) -> StreamedPlane:
    """The plane at ``file[start:stop]``: every field but the lines parsed (protobuf
    merges fields given in pieces), the lines' byte ranges kept."""
    small, lines = [], []
    for number, head, value, end in _file_fields(file, start, stop):
        if number == _PLANE_LINES:
            lines.append((value, end))
        else:
            file.seek(head)
            small.append(file.read(end - head))
    return StreamedPlane(_xplane_pb2().XPlane.FromString(b"".join(small)), path, lines)


def _file_fields(file, start: int, stop: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, start of the field, start and end of its value) of each field
    of the message at ``file[start:stop]``."""
    position = start
    while position < stop:
        file.seek(position)
        head = file.read(22)  # a tag and a length: two varints of at most 10 bytes
        tag, used = read_varint(head, 0)
        if tag & 7 == 2:
            length, used = read_varint(head, used)
            value, end = position + used, position + used + length
        else:  # (a group at this level is not in the head: the caller parses the file)
            value = position + used
            end = position + skip_field(head, used, tag)
        if end > stop:
            raise WireError(f"a field runs past its message (byte {position})")
        yield tag >> 3, position, value, end
        position = end


def _line_pieces(data: bytes, path: Path) -> Iterator[LinePiece]:
    """The line serialised in ``data`` as ``LinePiece`` s of runs of its events, each
    with all of the line's other fields (which may follow the events)."""
    raw_class = raw_line_class()
    if len(data) <= _GROUP_BYTES:  # one piece: nothing to walk
        yield _whole_line(data, path)
        return
    _, ends, others = walk_fields(data, _EVENTS_TAG)
    head = b"".join(data[start:stop] for start, stop in others)
    header = raw_class.FromString(head)
    ends = np.frombuffer(ends, np.int64)
    # The events fill the gaps between the other fields: each gap in runs of at least
    # _GROUP_BYTES, cut where an event ends.
    bounds = [0, *(position for field in others for position in field), len(data)]
    pieces = 0
    for run, gap_end in zip(bounds[::2], bounds[1::2], strict=True):
        while run < gap_end:
            cut = int(np.searchsorted(ends, run + _GROUP_BYTES))
            stop = min(int(ends[cut]) if cut < len(ends) else gap_end, gap_end)
            count = int(np.searchsorted(ends, stop, "right") - np.searchsorted(ends, run, "right"))
            yield LinePiece(head + data[run:stop], header, count, path)
            pieces, run = pieces + 1, stop
    if not pieces:
        yield LinePiece(head, header, 0, path)


def _whole_line(data: bytes, path: Path) -> LinePiece:
    """The line serialised in ``data``, whole, its events read as bytes (``raw_line_class``:
    in C, ~4x the line's size while it is held)."""
    line = raw_line_class().FromString(data)
    return LinePiece(data, line, len(line.events), path, whole=True)


def _stat_value(stat, stat_names: Mapping[int, str]):
    kind = stat.WhichOneof("value")
    if kind is None:
        return None
    value = getattr(stat, kind)
    return stat_names.get(value) if kind == "ref_value" else value


def named_stats(stats, stat_names: Mapping[int, str]) -> dict[str, object]:
    """``stats`` (``XStat`` messages) by their names in ``stat_names``; of stats of one
    name the last wins, as a stat counts by its name, not its metadata id."""
    return {stat_names.get(s.metadata_id, ""): _stat_value(s, stat_names) for s in stats}


def plane_events(plane, lines=None) -> Iterator[TraceEvent]:
    """Every event of a plane (of ``lines`` of it if given), with the stats of its
    metadata and its own (which win)."""
    stat_names = {key: meta.name for key, meta in plane.stat_metadata.items()}
    metadata = {}
    for key, meta in plane.event_metadata.items():
        metadata[key] = (meta.name, named_stats(meta.stats, stat_names))
    for line in plane.lines if lines is None else lines:
        line_name = line.display_name or line.name
        base_ps = line.timestamp_ns * 1000
        for event in line.events:
            name, meta_stats = metadata.get(event.metadata_id, ("", {}))
            stats = meta_stats
            if event.stats:
                stats = {**meta_stats, **named_stats(event.stats, stat_names)}
            start = base_ps + event.offset_ps
            end = start + event.duration_ps
            yield TraceEvent(plane.name, line_name, name, start, end, stats, line.id)


def host_planes(space) -> list:
    return [plane for plane in space.planes if plane.name.startswith(HOST_PLANE_PREFIX)]


def gpu_planes(space) -> dict[int, object]:
    """GPU planes by device ordinal (``/device:GPU:<n>``)."""
    planes = {}
    for plane in space.planes:
        match = GPU_PLANE.match(plane.name)
        if match:
            planes[int(match.group(1))] = plane
    return dict(sorted(planes.items()))


def step_markers(
    host_events: list[TraceEvent], names: frozenset[str] | set[str] = frozenset({STEP_EVENT_NAME})
) -> list[StepMarker]:
    """Steps marked on the host with ``Trace("train", step_num=n, _r=1)`` (or events of
    other ``names`` with a ``step_num``).

    When our profiler's markers are present, only they count: tf_keras marks every
    step itself (numbered within the epoch) and the two would nest. Markers of one step
    number that overlap on one thread are one step (see below).
    """
    markers = [
        event
        for event in host_events
        if event.name in names and event.stats.get("step_num") is not None
    ]
    own = [event for event in markers if event.stats.get(OWN_MARKER_STAT) is not None]
    # One marker per step, start and thread (a thread's duplicates are one event).
    steps = {
        (int(event.stats["step_num"]), event.start_ps, event.plane, event.line_id): event
        for event in own or markers
    }
    ordered = sorted(steps.items(), key=lambda item: (item[0][1], -item[1].end_ps))
    kept: list[StepMarker] = []
    reach: dict[tuple, StepMarker] = {}  # by (step, thread): the marker kept last
    for (step, start, *_), event in ordered:
        thread = (event.plane, event.line_id)
        last = reach.get((step, thread))
        # Two profilers in one Keras 3 fit each mark every step, in callback order:
        # their markers of one step cross (b1 < b2 < e1 < e2) and both hold the whole
        # train call. They are one step: the first (the outermost when nested) is kept,
        # as one profiler alone would mark it, and as the step rows took its step_ms
        # before markers were checked.
        if last is not None and start < last.end_ps:
            continue
        marker = StepMarker(step, start, event.end_ps, event.line, thread)
        reach[(step, thread)] = marker
        kept.append(marker)
    return kept


def find_traces(source: str | os.PathLike) -> list[Path]:
    """``.xplane.pb`` files: ``source`` itself, or all under a log dir (recursively),
    oldest capture first. Raises ``FileNotFoundError`` saying what was searched."""
    path = Path(source)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"No such file or directory: {path}")
    traces = sorted(path.glob(f"**/{PROFILE_SUBDIR}/*/*{TRACE_SUFFIX}"), key=_capture_order)
    if not traces:
        raise FileNotFoundError(
            f"No profiler traces (*{TRACE_SUFFIX}) under {path}. They are written by "
            f"kdt.DataParallelProfiler (or any TensorFlow profiler session) into "
            f"<log_dir>/train/{PROFILE_SUBDIR.as_posix()}/<capture>/."
        )
    return traces


def _capture_order(path: Path) -> tuple[str, str]:
    # Capture folders are named by time (YYYY_MM_DD_HH_MM_SS), so their names sort in time.
    return path.parent.name, str(path)
