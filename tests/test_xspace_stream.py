"""The streaming trace reader (``xspace.stream_xspace``) against protobuf's own parse
of the whole file: same planes, same lines, the same events in the same order."""

import pandas as pd
import pytest

from keras_dp_tools.analysis import analyze_trace, analyze_xspace
from keras_dp_tools.analysis.trace import xspace


def assert_streams_as_parsed(path, monkeypatch, group_bytes):
    """Every plane's fields and every line's events as protobuf parses the file whole,
    with lines cut into pieces of ``group_bytes`` of events."""
    parsed = xspace._xplane_pb2().XSpace.FromString(path.read_bytes())
    monkeypatch.setattr(xspace, "_GROUP_BYTES", group_bytes)
    streamed = xspace.stream_xspace(path)
    assert [plane.name for plane in streamed.planes] == [plane.name for plane in parsed.planes]
    pieces = 0
    for ours, theirs in zip(streamed.planes, parsed.planes, strict=True):
        assert ours.id == theirs.id
        assert dict(ours.event_metadata) == dict(theirs.event_metadata)
        assert dict(ours.stat_metadata) == dict(theirs.stat_metadata)
        assert list(ours.stats) == list(theirs.stats)
        lines = {}  # the pieces of each line, joined back
        for piece in ours.lines:
            header = (piece.id, piece.name, piece.display_name, piece.timestamp_ns)
            lines.setdefault(header, []).extend(piece.events)
            pieces += 1
        expected = {
            (line.id, line.name, line.display_name, line.timestamp_ns): list(line.events)
            for line in theirs.lines
        }
        assert lines == expected
    return pieces


@pytest.fixture(scope="module")
def captured_trace(demo_run):
    """A trace the TensorFlow profiler captured in the demo run (2 replicas)."""
    log_dir, _ = demo_run
    return next(log_dir.rglob("*.xplane.pb"))


@pytest.mark.slow
def test_a_captured_trace_streams_as_protobuf_parses_it(captured_trace, monkeypatch):
    whole_lines = assert_streams_as_parsed(captured_trace, monkeypatch, xspace._GROUP_BYTES)
    # Pieces of ~one event each: long lines come in many pieces, still the same events.
    assert assert_streams_as_parsed(captured_trace, monkeypatch, 64) > 10 * whole_lines
    monkeypatch.undo()
    streamed = analyze_trace(captured_trace, xprof=False)
    parsed = analyze_xspace(xspace.load_xspace(captured_trace))
    assert len(streamed.replicas) > 0
    pd.testing.assert_frame_equal(streamed.replicas, parsed.replicas)
    pd.testing.assert_frame_equal(streamed.steps, parsed.steps)


def test_a_gpu_trace_streams_as_protobuf_parses_it(tmp_path, monkeypatch, tf):
    from tests.helpers.gpu_traces import GRADIENT_BYTES, GpuTrace, two_gpu_run

    path = two_gpu_run(GpuTrace).write(tmp_path)
    for group_bytes in (xspace._GROUP_BYTES, 1):
        assert_streams_as_parsed(path, monkeypatch, group_bytes)
        streamed = analyze_trace(path, allreduce_bytes=GRADIENT_BYTES, xprof=False)
        parsed = analyze_xspace(xspace.load_xspace(path), allreduce_bytes=GRADIENT_BYTES)
        assert len(streamed.replicas) == 4  # two steps on two GPUs
        pd.testing.assert_frame_equal(streamed.replicas, parsed.replicas)


def test_line_fields_after_its_events_reach_every_piece(tmp_path, monkeypatch, tf):
    """protobuf writes a line's ``display_name`` (field 11) after its events (field 4)."""
    pb2 = xspace._xplane_pb2()
    space = pb2.XSpace()
    plane = space.planes.add(id=7, name="/host:CPU")
    plane.event_metadata[1].name = "op"
    line = plane.lines.add(id=3, name="tf_Compute", display_name="worker", timestamp_ns=5)
    for offset in range(20):
        line.events.add(metadata_id=1, offset_ps=offset * 10, duration_ps=5)
    plane.lines.add(id=4, name="empty", timestamp_ns=9)
    path = tmp_path / "h.xplane.pb"
    path.write_bytes(space.SerializeToString())
    assert assert_streams_as_parsed(path, monkeypatch, 1) == 20 + 1  # one piece per event
    monkeypatch.setattr(xspace, "_GROUP_BYTES", 1)
    pieces = list(xspace.stream_xspace(path).planes[0].lines)
    assert {piece.display_name for piece in pieces[:20]} == {"worker"}
    assert (pieces[-1].name, len(pieces[-1].events)) == ("empty", 0)


def test_a_torn_trace_is_refused_naming_the_file(tmp_path, tf):
    pb2 = xspace._xplane_pb2()
    space = pb2.XSpace()
    plane = space.planes.add(id=1, name="/host:CPU")
    plane.lines.add(id=1, name="python").events.add(metadata_id=1, offset_ps=1, duration_ps=1)
    data = space.SerializeToString()
    path = tmp_path / "torn.xplane.pb"
    path.write_bytes(data[:-3])
    with pytest.raises(ValueError, match=r"torn\.xplane\.pb"):
        xspace.stream_xspace(path)


def length_delimited(number, payload):
    size, length = len(payload), b""
    while size >= 0x80:
        length, size = length + bytes([size & 0x7F | 0x80]), size >> 7
    return bytes([number << 3 | 2]) + length + bytes([size]) + payload


def test_a_line_with_unknown_fields_and_two_timestamps_streams_as_parsed(tmp_path, monkeypatch, tf):
    """A long line whose events are interleaved with an unknown group field and a
    second ``timestamp_ns`` (protobuf keeps the last): every piece carries the line's
    fields as protobuf merges them, and the same events."""
    pb2 = xspace._xplane_pb2()
    events = [
        length_delimited(
            4, pb2.XEvent(metadata_id=1, offset_ps=o, duration_ps=5).SerializeToString()
        )
        for o in range(0, 60, 10)
    ]
    group = bytes([15 << 3 | 3, 1 << 3, 1, 15 << 3 | 4])
    raw = (
        pb2.XLine(id=3, name="tf_Compute", timestamp_ns=5).SerializeToString()
        + b"".join(events[:3])
        + group
        + pb2.XLine(timestamp_ns=9).SerializeToString()
        + b"".join(events[3:])
    )
    plane = pb2.XPlane(id=7, name="/host:CPU")
    plane.event_metadata[1].name = "op"
    data = plane.SerializeToString() + length_delimited(3, raw)
    path = tmp_path / "u.xplane.pb"
    path.write_bytes(length_delimited(1, data))
    assert assert_streams_as_parsed(path, monkeypatch, 1) == 6
    assert {piece.timestamp_ns for piece in xspace.stream_xspace(path).planes[0].lines} == {9}
    assert xspace.line_timestamps(xspace.stream_xspace(path).planes[0]) == [9]


def test_whole_lines_hold_every_line_as_protobuf_parses_it(tmp_path, monkeypatch, tf):
    """``StreamedPlane.whole_lines`` (the GPU readers' path): every line whole, however
    small the pieces of ``lines``, its fields and events those of protobuf's parse;
    counted without parsing them."""
    from tests.helpers.gpu_traces import GpuTrace, two_gpu_run

    path = two_gpu_run(GpuTrace).write(tmp_path)
    parsed = xspace._xplane_pb2().XSpace.FromString(path.read_bytes())
    monkeypatch.setattr(xspace, "_GROUP_BYTES", 1)  # would cut every line into events
    line_class = xspace._xplane_pb2().XLine
    for ours, theirs in zip(xspace.stream_xspace(path).planes, parsed.planes, strict=True):
        whole = list(ours.whole_lines())
        assert len(whole) == len(theirs.lines)
        for line, expected in zip(whole, theirs.lines, strict=True):
            assert (line.id, line.name, line.timestamp_ns) == (
                expected.id,
                expected.name,
                expected.timestamp_ns,
            )
            assert xspace.event_count(line) == len(expected.events)
            assert line_class.FromString(line.SerializeToString()) == expected
            assert list(line.events) == list(expected.events)
