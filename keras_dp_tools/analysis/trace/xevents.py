"""The events of an ``XLine`` and their stats as numpy arrays, read from its wire format.

Reading a field of a protobuf message from Python costs about a microsecond per message,
and an 8-GPU training window holds a million device events and launches. Here a line is
serialised once and parsed again with its events read as ``repeated bytes`` (both in C,
``xplane_proto.raw_line_class``), and then the fields of all events -- and of all their
stats -- are decoded together with numpy, one field position at a time (a message has a
handful of fields).

Field numbers from ``xplane.proto``: ``XEvent`` metadata_id 1,
duration_ps 3, stats 4 and its ``data`` oneof: offset_ps 2, num_occurrences 5;
``XStat`` metadata_id 1 and its ``value`` oneof: double_value 2, uint64_value 3,
int64_value 4, str_value 5, bytes_value 6, ref_value 7. A oneof holds one value: of
several members on the wire, protobuf keeps the last (and so do we).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from itertools import chain

import numpy as np

from keras_dp_tools.analysis.trace.xplane_proto import raw_line_class, xplane_pb2

_EVENT_METADATA, _EVENT_OFFSET, _EVENT_DURATION, _EVENT_STATS = 1, 2, 3, 4
_STAT_METADATA, _STAT_UINT, _STAT_INT, _STAT_STR, _STAT_REF = 1, 3, 4, 5, 7
# Wire types: varint, fixed64, length-delimited.
_VARINT, _FIXED64, _BYTES = 0, 1, 2
# XEvent's ``data`` oneof: offset_ps 2, num_occurrences 5 (field number: wire type).
_EVENT_ONEOF = {_EVENT_OFFSET: _VARINT, 5: _VARINT}
# XStat's ``value`` oneof: double 2, uint64 3, int64 4, str 5, bytes 6, ref 7. A member
# given with another wire type is an unknown field to protobuf, not a value.
_STAT_ONEOF = {2: _FIXED64, _STAT_UINT: _VARINT, _STAT_INT: _VARINT, _STAT_STR: _BYTES}
_STAT_ONEOF |= {6: _BYTES, _STAT_REF: _VARINT}
_PADDING = bytes(16)  # varint reads may look past a message's end before checking it


class WireError(ValueError):
    """Bytes that are not the protobuf wire format (of an ``XLine``, or of the file
    around it that ``xspace`` walks)."""


@dataclass
class EventTable:
    """A line's events (in line order) and their stats (by event, in order).

    Per event: ``metadata_id``, ``offset_ps``, ``duration_ps``. Per stat: ``event``
    (index of its event), ``metadata_id``, the value fields ids live in
    (``uint64_value`` as int64 bits, ``int64_value``, ``ref_value``) with masks of
    which one is set, and ``text(i)`` for a ``str_value``: as protobuf reads them, at
    most one per stat (the last member of the ``value`` oneof on the wire; the other
    values 0).
    """

    metadata_id: np.ndarray
    offset_ps: np.ndarray
    duration_ps: np.ndarray
    event: np.ndarray
    stat_metadata_id: np.ndarray
    uint64_value: np.ndarray
    has_uint64: np.ndarray
    int64_value: np.ndarray
    has_int64: np.ndarray
    ref_value: np.ndarray
    has_ref: np.ndarray
    _data: bytes
    _text: tuple[np.ndarray, np.ndarray, np.ndarray]  # stat (ascending), start, end

    def text(self, stat: int) -> str | None:
        """The ``str_value`` of stat ``stat``, None if it has none (looked up when asked:
        most strings, such as CUPTI's ``context_id``, are never read)."""
        owner, begin, end = self._text
        at = int(np.searchsorted(owner, stat, side="right")) - 1  # the last one wins
        if at < 0 or owner[at] != stat:
            return None
        return self._data[int(begin[at]) : int(end[at])].decode()


def read_line_events(line, stats_of: np.ndarray | None = None) -> EventTable:
    """The events of ``line`` (an ``XLine`` message, or an ``xspace.LinePiece``) as an
    ``EventTable``; see ``read_events`` for ``stats_of``."""
    return read_events([line if hasattr(line, "event_bytes") else _serialised(line)], stats_of)[0]


def read_events(lines: list, stats_of: np.ndarray | None = None) -> tuple[EventTable, np.ndarray]:
    """The events of several serialised lines at once (fewer, larger numpy calls), and
    the index in ``lines`` of each event's line.

    Args:
        lines: serialised ``XLine`` messages, or ``xspace.LinePiece`` s read whole
            (``whole_lines``: their events are parsed as bytes already).
        stats_of: event metadata ids whose events' stats are read (the table holds no
            stats of the others: decoding stats is most of the work); None: all.

    Raises:
        WireError: a line is not an ``XLine`` message.
    """
    try:
        return _read_events(lines, stats_of)
    except WireError:  # a field numpy does not decode (a group): protobuf skips it
        serialised = [
            line if isinstance(line, bytes) else line.SerializeToString() for line in lines
        ]
        return _read_events([_known_fields(line) for line in serialised], stats_of)


def _serialised(line) -> bytes:
    return line if isinstance(line, bytes) else line.SerializeToString()


def _known_fields(line: bytes) -> bytes:
    """The serialised line without the fields ``xplane.proto`` does not define, as
    protobuf's parser drops them (parsing and writing it again: rare, and exact)."""
    from google.protobuf.message import DecodeError

    try:
        message = xplane_pb2().XLine.FromString(line)
    except DecodeError as error:
        raise WireError(f"not an XLine message ({error})") from None
    message.DiscardUnknownFields()
    return message.SerializeToString()


def _read_events(lines: list[bytes], stats_of) -> tuple[EventTable, np.ndarray]:
    raw, starts, stops, line_of = _event_records(lines)
    data = np.frombuffer(raw, np.uint8)  # ends in _PADDING
    fields = (_EVENT_METADATA, _EVENT_OFFSET, _EVENT_DURATION)
    values, _, nested, data_field = _fields(
        data, starts, stops, fields, (_EVENT_STATS,), _EVENT_ONEOF
    )
    values[_EVENT_OFFSET][data_field != _EVENT_OFFSET] = 0  # a later num_occurrences
    event, stat_starts, stat_stops = nested[_EVENT_STATS]
    if stats_of is not None:
        wanted = np.isin(values[_EVENT_METADATA].view(np.int64)[event], stats_of)
        event, stat_starts, stat_stops = event[wanted], stat_starts[wanted], stat_stops[wanted]
    stat_fields = (_STAT_METADATA, _STAT_UINT, _STAT_INT, _STAT_REF)
    stats, present, texts, value_field = _fields(
        data, stat_starts, stat_stops, stat_fields, (_STAT_STR,), _STAT_ONEOF
    )
    owner, begin, end = texts[_STAT_STR]
    kept = value_field[owner] == _STAT_STR  # a later member of the oneof replaced it
    owner, begin, end = owner[kept], begin[kept], end[kept]
    for number in (_STAT_UINT, _STAT_INT, _STAT_REF):
        kept = value_field == number
        stats[number][present[number] & ~kept] = 0  # a later member replaced it
        present[number] = kept
    table = EventTable(
        *(values[field].view(np.int64) for field in fields),
        event,
        stats[_STAT_METADATA].view(np.int64),
        stats[_STAT_UINT].view(np.int64),
        present[_STAT_UINT],
        stats[_STAT_INT].view(np.int64),
        present[_STAT_INT],
        stats[_STAT_REF].view(np.int64),
        present[_STAT_REF],
        raw,
        (owner, begin, end),
    )
    return table, line_of


def _event_records(lines: list) -> tuple[bytes, np.ndarray, np.ndarray, np.ndarray]:
    """The events of lines (serialised, or whole ``xspace.LinePiece`` s, whose events are
    parsed as bytes already), the lines' other fields left out: those bytes, where each
    event starts and ends in them, and the index of its line. protobuf's parser (in C)
    cuts the events out, read as ``repeated bytes``."""
    from google.protobuf.message import DecodeError

    raw_line = raw_line_class()
    events = []
    for line in lines:
        try:
            events.append(
                line.event_bytes()
                if hasattr(line, "event_bytes")
                else raw_line.FromString(line).events
            )
        except DecodeError as error:
            raise WireError(f"not an XLine message ({error})") from None
    counts = [len(line_events) for line_events in events]
    flat = list(chain.from_iterable(events))
    lengths = np.fromiter(map(len, flat), np.int64, len(flat))
    stops = np.cumsum(lengths)
    starts = stops - lengths
    line_of = np.repeat(np.arange(len(lines)), counts)
    flat.append(_PADDING)  # varint reads may look past the last event's end
    return b"".join(flat), starts, stops, line_of


def walk_fields(raw: bytes, tag: int, first_only: bool = False):
    """One walk over the fields of the message serialised in ``raw`` (the only step
    taken per event in Python): where the value of each length-delimited field of
    ``tag`` starts and ends (two ``array('q')``; with ``first_only`` only the first's,
    enough to say whether there is one), and (start, end) of each other field, its tag
    included. Groups are skipped whole, as protobuf skips unknown fields.

    Raises:
        WireError: ``raw`` is not a message.
    """
    starts, ends, others = array("q"), array("q"), []
    add_start, add_end = starts.append, ends.append
    position, end = 0, len(raw)
    while position < end:
        run = position
        try:  # runs of fields of ``tag`` shorter than 128 bytes (events): kept short
            if first_only:
                while raw[position] == tag and raw[position + 1] < 0x80:
                    position += 2 + raw[position + 1]
            else:
                while raw[position] == tag and raw[position + 1] < 0x80:
                    value = position + 2
                    position = value + raw[position + 1]
                    add_start(value)
                    add_end(position)
        except IndexError:  # the run reached the end (or ran past it: checked below)
            pass
        if first_only and position > run and not starts:
            add_start(run + 2)
            add_end(run + 2 + raw[run + 1])
        if position >= end:
            break
        field = position
        key, position = read_varint(raw, position)
        if key == tag:
            length, value = read_varint(raw, position)
            position = value + length
            if not (first_only and starts):
                add_start(value)
                add_end(position)
        else:
            position = skip_field(raw, position, key)
            others.append((field, position))
    if position != end:
        raise WireError("a field runs past its message")
    return starts, ends, others


def skip_field(raw: bytes, position: int, key: int) -> int:
    """Where the value of a field of tag ``key`` that starts at ``position`` ends."""
    wire = key & 7
    if wire == 0:
        return read_varint(raw, position)[1]
    if wire == 1 or wire == 5:
        return position + (8 if wire == 1 else 4)
    if wire == 2:
        length, position = read_varint(raw, position)
        return position + length
    if wire == 3:  # a group: fields up to the end-group tag of its number
        while True:
            inner, position = read_varint(raw, position)
            if inner == (key >> 3) << 3 | 4:
                return position
            position = skip_field(raw, position, inner)
    raise WireError(f"wire type {wire} where a field starts")


def read_varint(raw: bytes, position: int) -> tuple[int, int]:
    """The varint at ``raw[position:]`` and the position after it."""
    result = shift = 0
    while shift < 70:
        if position >= len(raw):
            raise WireError("truncated varint")
        byte = raw[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, position
        shift += 7
    raise WireError("varint longer than 10 bytes")


def _varints(data: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The values (uint64) of the varints at ``positions`` and where each ends. Most
    are one byte (tags, lengths, ids): read at once; only the longer ones loop."""
    byte = data[positions]
    value = (byte & 0x7F).astype(np.uint64)
    ends = positions + 1
    longer = np.flatnonzero(byte >= 0x80)
    for shift in range(7, 70, 7):
        if not len(longer):
            return value, ends
        at = ends[longer]
        byte = data[at]
        value[longer] |= (byte & 0x7F).astype(np.uint64) << np.uint64(shift)
        ends[longer] = at + 1
        longer = longer[byte >= 0x80]
    if len(longer):
        raise WireError("varint longer than 10 bytes")
    return value, ends


def _fields(data, starts, stops, varint_fields, nested_fields, oneof=None):
    """Decodes the messages at ``data[starts[i]:stops[i]]`` all together, one field
    position at a time: per message the value of each of ``varint_fields`` (the last
    one wins, as protobuf merges) and whether it was set; for each of
    ``nested_fields``, every occurrence as (message, start, end), by message, in order;
    and, given a oneof's members (field number: wire type), the number of the member
    that came last per message (0: none): the one protobuf keeps.
    """
    count = len(starts)
    values = {field: np.zeros(count, np.uint64) for field in varint_fields}
    present = {field: np.zeros(count, bool) for field in varint_fields}
    found = {field: [] for field in nested_fields}
    oneof = oneof or {}
    last_member = np.zeros(count if oneof else 0, np.int64)
    # Members read as something else: found among the fields of their wire type.
    others = [(n, w) for n, w in oneof.items() if n not in varint_fields and n not in found]
    # The messages still being read: which, where their next field starts, where they end.
    live = np.flatnonzero(starts < stops)
    position, stop = starts[live], stops[live]
    while len(live):
        byte = data[position]
        if (byte < 0x80).all():  # one-byte tags: field numbers below 16
            field, wire, at = (byte >> 3).astype(np.int64), byte & 7, position + 1
        else:
            tag, at = _varints(data, position)
            field = (tag >> np.uint64(3)).astype(np.int64)
            wire = (tag & np.uint64(7)).astype(np.int64)
        wires = np.bincount(np.minimum(wire, 7), minlength=8)
        if wires[[3, 4, 6, 7]].any():
            raise WireError("not an XEvent / XStat message")
        after = at + 4  # fixed32 (wire type 5); the others below
        is_varint = _which(wire, _VARINT, wires)
        varint_live, varint_field = live[is_varint], field[is_varint]
        value, after[is_varint] = _varints(data, at[is_varint])
        numbers = _counts(varint_field)
        for number in varint_fields:
            chosen = _which(varint_field, number, numbers)
            owners = varint_live[chosen]
            values[number][owners] = value[chosen]
            present[number][owners] = True
            if oneof.get(number) == _VARINT:
                last_member[owners] = number
        is_bytes = _which(wire, _BYTES, wires)
        bytes_live, bytes_field = live[is_bytes], field[is_bytes]
        length, begin = _varints(data, at[is_bytes])
        end = begin + length.astype(np.int64)
        after[is_bytes] = end
        numbers = _counts(bytes_field)
        for number in nested_fields:
            chosen = _which(bytes_field, number, numbers)
            owners = bytes_live[chosen]
            found[number].append((owners, begin[chosen], end[chosen]))
            if oneof.get(number) == _BYTES:
                last_member[owners] = number
        is_fixed64 = _which(wire, _FIXED64, wires)
        after[is_fixed64] += 4
        for number, kind in others:
            subset = {_VARINT: is_varint, _FIXED64: is_fixed64, _BYTES: is_bytes}[kind]
            last_member[live[subset][field[subset] == number]] = number
        if (after > stop).any():
            raise WireError("not an XEvent / XStat message")
        going = after < stop
        if going.all():
            position = after
        else:
            live, position, stop = live[going], after[going], stop[going]
    nested = {}
    for number, parts in found.items():
        owner, begin, end = (
            np.concatenate([part[column] for part in parts] or [np.empty(0, np.int64)])
            for column in range(3)
        )
        if len(parts) > 1:  # each part is by message; a message's fields in part order
            order = np.argsort(owner, kind="stable")
            owner, begin, end = owner[order], begin[order], end[order]
        nested[number] = owner, begin, end
    return values, present, nested, last_member


_ALL = slice(None)  # as an index: every element, without a copy
_NONE = np.empty(0, np.int64)


def _counts(keys: np.ndarray) -> np.ndarray | None:
    """How many of ``keys`` (field numbers) are each number, if all are small."""
    return np.bincount(keys, minlength=16) if len(keys) and keys.max() < 64 else None


def _which(keys: np.ndarray, key: int, counts: np.ndarray | None):
    """Where ``keys == key``, as an index: ``_ALL`` if everywhere, ``_NONE`` if nowhere
    (most field positions hold one field in every message: no search, no copy)."""
    if counts is not None and key < len(counts):
        if counts[key] == len(keys):
            return _ALL
        if counts[key] == 0:
            return _NONE
    return np.flatnonzero(keys == key)
