"""Which replica a per-replica copy of an op belongs to, on CPU logical devices.

TensorFlow builds a collective once per replica in a loop over the replicas, and the
graph's name scope numbers the copies in creation order: ``CollectiveReduceV2``,
``CollectiveReduceV2_1``, ... or, for the all-gather of sparse gradients, one ``cond``
per replica (``adam/cond/.../CollectiveGatherV2``, ``adam/cond_1/...``). Seen in TF 2.21
captures: the number is the copy's, not the replica's: with two gradient packs the
replicas' copies are ``_0, _2, _4, _6`` for one pack and ``_1, _3, _5, _7`` for the
other, and inside ``cond_2`` the values and indices gathers are ``CollectiveGatherV2``
and ``CollectiveGatherV2_1``. What does identify the replica is the order of the
copies *within one collective* (the ops of one peer key): the k-th copy created is
replica k's. When the copies' names do not tell that order (they differ in no
numbered scope, or the group is not one op per replica), the attribution is
ambiguous and ``peer_replicas`` says why instead of guessing.

``attribute_cpu_replicas`` applies this to the spans of a CPU trace.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from keras_dp_tools.analysis.breakdown.classify import copy_number, scoped_replica
from keras_dp_tools.analysis.breakdown.spans import NO_REPLICA, Spans

_NUMBERED = re.compile(r"^(?P<base>.*?[^\d_].*?)(?:_(?P<index>\d+))?$")
_FUNCTION_ID = re.compile(r"^_\d+$")  # ids of inlined function bodies: "_90", "_126"


def copy_numbers(names: Sequence[str]) -> list[tuple[int, ...]] | None:
    """Per name, the numbers of the scope components in which the names differ
    (unnumbered = 0), in path order; None if the names differ otherwise."""
    paths = [name.split("/") for name in names]
    if len({len(path) for path in paths}) != 1:
        return None
    numbers: list[list[int]] = [[] for _ in names]
    for parts in zip(*paths, strict=True):
        if len(set(parts)) == 1 or all(_FUNCTION_ID.match(part) for part in parts):
            continue
        matches = [_NUMBERED.match(part) for part in parts]
        if None in matches or len({match.group("base") for match in matches}) != 1:
            return None
        for position, match in enumerate(matches):
            numbers[position].append(int(match.group("index") or 0))
    return [tuple(number) for number in numbers]


def peer_replicas(names: Sequence[str], replicas: int) -> tuple[list[int] | None, str | None]:
    """Replica of each copy of one collective (one name per copy), or (None, reason).

    Copies are ranked by their copy numbers: TensorFlow creates them replica by replica.
    """
    if len(names) != replicas:
        return None, f"a collective had {len(names)} copies for {replicas} replicas"
    numbers = copy_numbers(names)
    if numbers is None or len(set(numbers)) != len(numbers):
        return None, f"the copies of a collective are not numbered apart ({', '.join(names)})"
    order = sorted(range(len(names)), key=numbers.__getitem__)
    replica_of = [0] * len(names)
    for rank, position in enumerate(order):
        replica_of[position] = rank
    return replica_of, None


def packed_replica(index: int, copies: Sequence[int], replicas: int) -> int | None:
    """Replica of the copy numbered ``index`` among ``copies`` (all numbers of one op
    name seen, e.g. the ``concat`` ops that pack gradients): TF builds every pack of
    replica 0 first, so with p packs per replica the rank divided by p. None when the
    count is not a multiple of the replicas."""
    ordered = sorted(set(copies))
    if not ordered or len(ordered) % replicas:
        return None
    return ordered.index(index) // (len(ordered) // replicas)


def attribute_cpu_replicas(spans: Spans, replica_count: int) -> tuple[Spans, str | None]:
    """Gives the per-replica copies of collectives and packing ops their replica (see
    this module's docstring); returns the spans and why some could not be
    attributed (None if all could)."""
    peers: dict[object, list[int]] = defaultdict(list)
    for position, key in spans.keys.items():
        peers[key].append(position)
    replica_of: dict[int, int] = {}
    reasons = []
    decided: dict[tuple[str, ...], tuple] = {}  # every step repeats the same names
    for positions in peers.values():
        names = tuple(spans.names[p].rsplit(":", 1)[0] for p in positions)
        if names not in decided:
            scoped = all(scoped_replica(name) is not None for name in names)
            decided[names] = None if scoped else peer_replicas(list(names), replica_count)
        if decided[names] is None:
            continue  # replica scopes say it
        replicas, reason = decided[names]
        if replicas is None:
            reasons.append(reason)
            continue
        replica_of.update(zip(positions, replicas, strict=True))
    copies: dict[str, set[int]] = defaultdict(set)
    unkeyed = {p: name for p, name in spans.names.items() if p not in spans.keys}
    for name in unkeyed.values():
        base, number = copy_number(name)
        copies[base].add(number)
    for position, name in unkeyed.items():
        if position in replica_of or scoped_replica(name) is not None:
            continue
        base, number = copy_number(name)
        replica = packed_replica(number, copies[base], replica_count)
        if replica is None and len(copies[base]) == 1:
            replica = 0  # one unscoped copy: replica 0's op
        elif replica is None:
            reasons.append(f"{len(copies[base])} copies of {base} for {replica_count} replicas")
        if replica is not None:
            replica_of[position] = replica
    resolved = spans.replica.copy()
    beyond = resolved >= replica_count  # a guess, for spans the copies do not place
    resolved[beyond] %= replica_count
    if replica_of:
        resolved[np.fromiter(replica_of, np.int64)] = np.fromiter(replica_of.values(), np.int64)
    reason = "; ".join(sorted(set(reasons))) or None
    return replace(spans, replica=resolved), reason


def cpu_replica_count(spans: Spans) -> int:
    """Peers of the largest collective (one op per replica), else the replica scopes."""
    peers = Counter(spans.keys.values())
    unnamed = np.ones(len(spans.replica), dtype=bool)
    unnamed[list(spans.names)] = False
    scoped = spans.replica[unnamed & (spans.replica != NO_REPLICA)]
    return max(peers.values(), default=0) or 1 + max(int(scoped.max()) if len(scoped) else 0, 0)
