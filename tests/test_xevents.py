"""``xevents`` (a line's events and stats decoded with numpy from the wire format)
against protobuf's own parser of the same bytes."""

import itertools
import random

import pytest

from keras_dp_tools.analysis.trace.xevents import WireError, read_events, read_line_events


@pytest.fixture(scope="module")
def xplane_pb2(tf):  # the proto classes ship with TensorFlow
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    return xplane_pb2


def assert_table_matches(table, line):
    """The table holds ``line``'s events and stats (as protobuf parsed them)."""
    assert table.metadata_id.tolist() == [e.metadata_id for e in line.events]
    assert table.offset_ps.tolist() == [e.offset_ps for e in line.events]
    assert table.duration_ps.tolist() == [e.duration_ps for e in line.events]
    stats = [(i, s) for i, e in enumerate(line.events) for s in e.stats]
    assert table.event.tolist() == [i for i, _ in stats]
    assert table.stat_metadata_id.tolist() == [s.metadata_id for _, s in stats]
    for position, (_, stat) in enumerate(stats):
        kind = stat.WhichOneof("value")
        assert table.has_uint64[position] == (kind == "uint64_value")
        assert int(table.uint64_value[position]) % (1 << 64) == stat.uint64_value
        assert table.has_int64[position] == (kind == "int64_value")
        assert table.int64_value[position] == stat.int64_value
        assert table.has_ref[position] == (kind == "ref_value")
        assert table.ref_value[position] == stat.ref_value
        assert table.text(position) == (stat.str_value if kind == "str_value" else None)


def tag(number, wire):
    return bytes([number << 3 | wire])


def length_delimited(number, payload):  # payloads < 128 bytes here
    return tag(number, 2) + bytes([len(payload)]) + payload


# Fields xplane.proto does not define, one per wire type, and a group nesting one.
UNKNOWN_FIELDS = {
    "varint": tag(9, 0) + b"\x85\x01",
    "fixed64": tag(10, 1) + bytes(8),
    "fixed32": tag(11, 5) + bytes(4),
    "bytes": length_delimited(12, b"xyz"),
    "two-byte tag": bytes([20 << 3 & 0x7F | 0x80, 20 >> 4]) + b"\x05",  # field 20, a varint
    "group": tag(15, 3) + tag(1, 0) + b"\x01" + tag(2, 3) + tag(2, 4) + tag(15, 4),
}


@pytest.mark.parametrize("unknown", sorted(UNKNOWN_FIELDS))
def test_unknown_fields_are_skipped_as_protobuf_skips_them(xplane_pb2, unknown):
    """An unknown field (of each wire type, groups included) inside an event, inside a
    stat and between a line's events: the events and stats are protobuf's."""
    extra = UNKNOWN_FIELDS[unknown]
    stat = xplane_pb2.XStat(metadata_id=2, uint64_value=77).SerializeToString()
    event = xplane_pb2.XEvent(metadata_id=1, offset_ps=10, duration_ps=20).SerializeToString()
    events = [
        length_delimited(4, event + extra + length_delimited(4, stat + extra)),
        extra,
        length_delimited(4, extra + event),
    ]
    raw = xplane_pb2.XLine(timestamp_ns=5).SerializeToString() + b"".join(events)
    table, line_of = read_events([raw, raw])
    parsed = xplane_pb2.XLine.FromString(raw + raw)  # the two lines' events, merged
    assert_table_matches(table, parsed)
    assert line_of.tolist() == [0, 0, 1, 1]


def test_bytes_that_are_not_a_line_are_refused(xplane_pb2):
    event = xplane_pb2.XEvent(metadata_id=1, duration_ps=20).SerializeToString()
    with pytest.raises(WireError):
        read_events([length_delimited(4, event + tag(15, 3))])  # a group never closed


def test_line_events_read_from_the_wire_match_protobuf(xplane_pb2):
    """``xevents`` decodes a line's events and stats with numpy; protobuf's own parser
    is the reference, on values that need every varint length (negative int64, uint64
    above 2**63), events longer than 127 bytes, strings, doubles and refs."""
    chance = random.Random(12)
    line = xplane_pb2.XLine(id=7, name="Stream #7(Compute)", timestamp_ns=1 << 60)
    for index in range(300):
        event = line.events.add(
            metadata_id=chance.choice([1, 200, 1 << 40]),
            duration_ps=chance.choice([0, 5, 1 << 62]),
        )
        if index % 7:
            event.offset_ps = chance.choice([0, 127, 128, -1, (1 << 63) - 1])
        else:
            event.num_occurrences = 3  # the oneof's other member: no offset
        for _ in range(chance.randrange(5)):
            stat = event.stats.add(metadata_id=chance.choice([1, 3, 300]))
            which = chance.randrange(6)
            if which == 0:
                stat.uint64_value = chance.choice([0, 1, (1 << 64) - 1])
            elif which == 1:
                stat.int64_value = chance.choice([-1, -(1 << 63), 42])
            elif which == 2:
                stat.ref_value = chance.choice([0, 9, 1 << 33])
            elif which == 3:
                stat.str_value = "x" * chance.choice([0, 3, 200])
            elif which == 4:
                stat.double_value = 0.5
    line.display_name = "after the events"
    assert_table_matches(read_line_events(line), line)


# The members of XStat's ``value`` oneof, each as a stat that sets only it.
STAT_VALUES = {
    "double_value": 0.25,
    "uint64_value": (1 << 64) - 3,
    "int64_value": -7,
    "str_value": "ab",
    "bytes_value": b"\x00z",
    "ref_value": 9,
}


def test_a_oneof_given_twice_keeps_its_last_member_as_protobuf_does(xplane_pb2):
    """A stat whose bytes carry two members of the ``value`` oneof (say a uint64 and
    then an int64) holds the last one, as protobuf reads it; so does an event whose
    ``offset_ps`` is followed by ``num_occurrences`` (the ``data`` oneof), and a member
    given with another wire type is an unknown field, not a value. Every ordered pair
    of members, in one line; protobuf's parse of the same bytes is the reference."""
    events = []
    for first, second in itertools.permutations(STAT_VALUES, 2):
        stat = b"".join(
            xplane_pb2.XStat(metadata_id=2, **{name: STAT_VALUES[name]}).SerializeToString()
            for name in (first, second)
        )
        event = xplane_pb2.XEvent(metadata_id=1, offset_ps=10, duration_ps=20)
        events.append(length_delimited(4, event.SerializeToString() + length_delimited(4, stat)))
    later = xplane_pb2.XEvent(num_occurrences=4).SerializeToString()
    events.append(length_delimited(4, xplane_pb2.XEvent(offset_ps=30).SerializeToString() + later))
    wrong_wire = length_delimited(3, b"\x05")  # uint64_value's number, as bytes
    stat = xplane_pb2.XStat(metadata_id=2, int64_value=5).SerializeToString() + wrong_wire
    events.append(length_delimited(4, length_delimited(4, stat)))
    raw = b"".join(events)
    parsed = xplane_pb2.XLine.FromString(raw)
    assert [s.WhichOneof("value") for s in parsed.events[0].stats] == ["uint64_value"]
    assert parsed.events[-2].offset_ps == 0 and parsed.events[-1].stats[0].int64_value == 5
    assert_table_matches(read_events([raw])[0], parsed)


def test_stats_are_read_for_the_events_asked_for_only(xplane_pb2):
    """``stats_of``: every event's fields, and the stats (as protobuf parses them) of the
    events whose metadata id is asked for, in order; none of the others'."""
    line = xplane_pb2.XLine(id=1, name="python", timestamp_ns=5)
    for index in range(40):
        event = line.events.add(metadata_id=index % 4, offset_ps=index * 10, duration_ps=3)
        for value in range(index % 3):
            event.stats.add(metadata_id=9, uint64_value=index * 100 + value)
    table = read_line_events(line, stats_of=[2, 3])
    assert table.metadata_id.tolist() == [index % 4 for index in range(40)]
    assert table.offset_ps.tolist() == [index * 10 for index in range(40)]
    kept = [(i, s) for i, e in enumerate(line.events) if e.metadata_id in (2, 3) for s in e.stats]
    assert table.event.tolist() == [i for i, _ in kept]
    assert table.uint64_value.tolist() == [s.uint64_value for _, s in kept]
    assert len(kept) == 20  # events 2, 3, 6, 7, ... 39: index % 3 stats each
