"""The spans of a trace as columns: what the step engine reads.

A span is one classified event (or one GPU event) reduced to its kind, replica, start
and end (picoseconds from an origin), plus the few links the engine needs: the marker
that launched it (GPU), whether it counts towards the all-reduce bandwidth, and for
collectives the key that names the same collective on every replica.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

NO_REPLICA = -1  # a span shared by all replicas


@dataclass
class Spans:
    """The spans of a trace as columns (one entry per span, in trace order until
    ``sort_by_start``).

    Times are picoseconds from ``origin_ps`` (absolute picoseconds overflow int64).
    Only the few spans whose replica the op's copies decide carry a ``name``, and only
    collectives a ``peer_key`` (both by position).
    """

    origin_ps: int
    kind: np.ndarray
    replica: np.ndarray  # NO_REPLICA: shared by all replicas
    start: np.ndarray
    end: np.ndarray
    launched: np.ndarray  # GPU: index of the marker that launched it; -1: by time
    reducing: np.ndarray  # counts towards the all-reduce bandwidth (not another NCCL op)
    keys: dict[int, tuple] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)
    # Once sorted by start, the peer keys as integers (``_key_ids``) replace ``keys``,
    # and ``names`` (read by the replica attribution, in trace order) are dropped.
    key_ids: tuple | None = None


class SpanColumns:
    """Collects spans into ``Spans``: whole lines at once as arrays (``extend``), or
    row by row (``add``). The columns most spans leave at their default (launch link,
    bandwidth use) are kept sparse."""

    def __init__(self, origin_ps: int):
        self.origin_ps = origin_ps
        self.count = 0
        self.chunks: list[tuple[np.ndarray, ...]] = []  # (kind, replica, start, end)
        self.rows: list[tuple[int, int, int, int]] = []  # added one by one, not yet chunked
        self.launched: dict[int, int] = {}
        self.not_reducing: list[int] = []
        # (first position, array) of the launch links and bandwidth flags ``extend`` took.
        self.launched_runs: list[tuple[int, np.ndarray]] = []
        self.reducing_runs: list[tuple[int, np.ndarray]] = []
        self.keys, self.names = {}, {}

    def add(self, kind, replica, start, end, launched=-1, reducing=True, key=None, name=""):
        position = self.count
        if key is not None:
            self.keys[position] = key
        if name:
            self.names[position] = name
        if launched >= 0:
            self.launched[position] = launched
        if not reducing:
            self.not_reducing.append(position)
        self.rows.append((kind, NO_REPLICA if replica is None else replica, start, end))
        self.count += 1

    def extend(
        self, kind, replica, start, end, keys=None, names=None, launched=None, reducing=None
    ) -> None:
        """Appends spans given as arrays; ``keys`` and ``names`` by index in them;
        ``launched`` and ``reducing`` as arrays (as ``add``'s arguments per span)."""
        self._chunk_rows()
        for index, key in sorted((keys or {}).items()):  # in trace order, as ``add``
            self.keys[self.count + index] = key
        for index, name in sorted((names or {}).items()):
            self.names[self.count + index] = name
        if launched is not None:
            self.launched_runs.append((self.count, launched))
        if reducing is not None:
            self.reducing_runs.append((self.count, reducing))
        self._append(kind, replica, start, end)
        self.count += len(kind)

    def _append(self, kind, replica, start, end) -> None:
        # Kinds and replicas are small numbers: held compact from the start.
        self.chunks.append((kind.astype(np.int8, copy=False), _compact(replica), start, end))

    def _chunk_rows(self) -> None:
        if self.rows:
            self._append(*np.array(self.rows, dtype=np.int64).T)
            self.rows = []

    def build(self, release_memory: Callable[[], None]) -> Spans:
        self._chunk_rows()
        # Column by column, each column's chunks freed once joined and their memory
        # handed back: the spans are held about once, not twice, at the peak.
        parts = [list(column) for column in zip(*self.chunks, strict=True)] or [[]] * 4
        self.chunks = []
        kind, replica, start, end = (
            _join(parts, column, dtype, release_memory)
            for column, dtype in enumerate((np.int8, np.int16, np.int64, np.int64))
        )
        # Marker indices: int32 unless a trace ever holds 2**31 markers.
        largest = max(
            [
                *self.launched.values(),
                *(int(run.max()) for _, run in self.launched_runs if len(run)),
            ],
            default=0,
        )
        launched = np.full(self.count, -1, dtype=_index_dtype(largest))
        launched[np.fromiter(self.launched, np.int64)] = np.fromiter(
            self.launched.values(), np.int64
        )
        reducing = np.ones(self.count, dtype=bool)
        reducing[self.not_reducing] = False
        for first, run in self.launched_runs:
            launched[first : first + len(run)] = run
        for first, run in self.reducing_runs:
            reducing[first : first + len(run)] = run
        self.launched_runs, self.reducing_runs = [], []
        keys, names, self.keys, self.names = self.keys, self.names, {}, {}  # handed over
        return Spans(self.origin_ps, kind, replica, start, end, launched, reducing, keys, names)


def sort_by_start(spans: Spans, release_memory: Callable[[], None]) -> None:
    """Puts the spans in order of start, in place (stable: equal starts keep trace
    order), so the step index needs no positions and no copy of the starts. The sync
    waits break ties of clipped starts by this order: real start, then trace order.
    Holds a column twice at most, one at a time; columns of one value (CPU traces:
    launch links, bandwidth use) take no memory."""
    count = len(spans.start)
    for column in ("launched", "reducing"):
        values = getattr(spans, column)
        if len(values) and not (values != values[0]).any():
            setattr(spans, column, np.broadcast_to(values[:1].copy(), values.shape))
    key_ids, iteration_ids = _key_ids(spans)
    spans.keys, spans.names = {}, {}
    release_memory()
    order = np.argsort(spans.start, kind="stable").astype(_index_dtype(count), copy=False)
    release_memory()  # the int64 order, where glibc put it on the heap
    marked = np.zeros(count, dtype=bool)
    marked[key_ids.positions] = True
    moved = np.flatnonzero(marked[order])  # new positions of the keyed spans
    del marked
    new_of = dict(zip(order[moved].tolist(), moved.tolist(), strict=True))
    new_positions = np.fromiter(map(new_of.__getitem__, key_ids.positions.tolist()), np.int64)
    spans.key_ids = KeyIds(new_positions, key_ids.ids), iteration_ids
    for column in ("kind", "replica", "start", "end", "launched", "reducing"):
        values = getattr(spans, column)
        if values.strides != (0,):  # not one value
            setattr(spans, column, values[order])
            del values
            release_memory()  # the column in trace order
    del order
    release_memory()


def _index_dtype(largest: int):
    return np.int32 if largest < np.iinfo(np.int32).max else np.int64


def _compact(values: np.ndarray) -> np.ndarray:
    """``values`` as int16 where they fit (replica numbers always do in practice):
    a quarter of the memory of the engine's most repeated small column."""
    limits = np.iinfo(np.int16)
    if not len(values) or (values.min() >= limits.min and values.max() <= limits.max):
        return values.astype(np.int16)
    return values


def _join(parts: list[list[np.ndarray]], column: int, dtype, release_memory) -> np.ndarray:
    """One column's chunks joined (in ``dtype``, or wider where a chunk needs it)."""
    chunks, parts[column] = parts[column], []
    if not chunks:
        return np.empty(0, dtype)
    joined = np.concatenate(chunks, dtype=np.result_type(dtype, *chunks))
    chunks.clear()
    release_memory()
    return joined


class KeyIds:
    """Peer keys as integers, looked up by span positions (-1: none): held only for
    the collectives, not per span."""

    def __init__(self, positions: np.ndarray, ids: np.ndarray):
        order = np.argsort(positions)
        self.positions, self.ids = positions[order], ids[order]

    def __getitem__(self, positions) -> np.ndarray:
        positions = np.asarray(positions)
        if not len(self.positions):
            return np.full(positions.shape, -1, dtype=np.int64)
        at = np.minimum(np.searchsorted(self.positions, positions), len(self.positions) - 1)
        return np.where(self.positions[at] == positions, self.ids[at], -1)


def _key_ids(spans: Spans):
    """Peer keys as integers by span position (``KeyIds``) and each key's
    ``iter_id`` as an integer (-1: none)."""
    ids: dict[tuple, int] = {}
    key_ids = KeyIds(
        np.fromiter(spans.keys, np.int64, len(spans.keys)),
        np.fromiter((ids.setdefault(key, len(ids)) for key in spans.keys.values()), np.int64),
    )
    iterations: dict[object, int] = {}
    iteration_ids = np.array(
        [-1 if key[-1] is None else iterations.setdefault(key[-1], len(iterations)) for key in ids],
        dtype=np.int64,
    )
    return key_ids, iteration_ids
