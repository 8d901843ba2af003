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

# The step marker and capture path (keras_dp_tools.contract), shared with capture.
from keras_dp_tools.contract import OWN_MARKER_STAT, PROFILE_SUBDIR, STEP_EVENT_NAME, TRACE_SUFFIX

HOST_PLANE_PREFIX = "/host:"
GPU_PLANE = re.compile(r"^/device:GPU:(\d+)$")


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One event of a trace: where it ran, what it is called, when, and its stats."""

    plane: str
    line: str
    name: str
    start_ps: int
    end_ps: int
    stats: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StepMarker:
    """A step as marked on the host: ``step`` is the marker's ``step_num``."""

    step: int
    start_ps: int
    end_ps: int


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


def _xplane_pb2():
    """TensorFlow's ``xplane_pb2``. Where TensorFlow is not imported yet (the analysis
    process), its generated module is loaded on its own: it needs only protobuf, while
    importing TensorFlow takes seconds of CPU."""
    import sys

    if "tensorflow" not in sys.modules:
        if _STANDALONE not in sys.modules:
            import importlib.util

            package = importlib.util.find_spec("tensorflow")
            folder = Path(package.origin).parent if package and package.origin else None
            source = folder / "tsl" / "profiler" / "protobuf" / "xplane_pb2.py" if folder else None
            if source is not None and source.exists():
                spec = importlib.util.spec_from_file_location(_STANDALONE, source)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                sys.modules[_STANDALONE] = module
        if _STANDALONE in sys.modules:
            return sys.modules[_STANDALONE]
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    return xplane_pb2


_STANDALONE = "keras_dp_tools._xplane_pb2"


def _stat_value(stat, stat_names: Mapping[int, str]):
    kind = stat.WhichOneof("value")
    if kind is None:
        return None
    value = getattr(stat, kind)
    return stat_names.get(value) if kind == "ref_value" else value


def _stats(stats, stat_names: Mapping[int, str]) -> dict[str, object]:
    return {stat_names.get(s.metadata_id, ""): _stat_value(s, stat_names) for s in stats}


def plane_events(plane) -> Iterator[TraceEvent]:
    """Every event of a plane, with the stats of its metadata and its own (which win)."""
    stat_names = {key: meta.name for key, meta in plane.stat_metadata.items()}
    metadata = {}
    for key, meta in plane.event_metadata.items():
        metadata[key] = (meta.name, _stats(meta.stats, stat_names))
    for line in plane.lines:
        line_name = line.display_name or line.name
        base_ps = line.timestamp_ns * 1000
        for event in line.events:
            name, meta_stats = metadata.get(event.metadata_id, ("", {}))
            stats = {**meta_stats, **_stats(event.stats, stat_names)} if event.stats else meta_stats
            start = base_ps + event.offset_ps
            yield TraceEvent(plane.name, line_name, name, start, start + event.duration_ps, stats)


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


def step_markers(host_events: list[TraceEvent]) -> list[StepMarker]:
    """Steps marked on the host with ``Trace("train", step_num=n, _r=1)``.

    When our profiler's markers are present, only they count: tf_keras marks every
    step itself (numbered within the epoch) and the two would nest.
    """
    markers = [
        event
        for event in host_events
        if event.name == STEP_EVENT_NAME and event.stats.get("step_num") is not None
    ]
    own = [event for event in markers if event.stats.get(OWN_MARKER_STAT) is not None]
    steps = {
        (int(event.stats["step_num"]), event.start_ps): event.end_ps for event in own or markers
    }
    return sorted(
        (StepMarker(step, start, end) for (step, start), end in steps.items()),
        key=lambda marker: marker.start_ps,
    )


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
