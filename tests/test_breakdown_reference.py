"""The vectorised breakdown agrees with a brute-force reference on random CPU traces.

The reference below is written from the column definitions in docs/breakdown.md, one
step and one replica at a time, with plain Python interval lists: it shares no code
with the engine (which assigns all spans to all steps at once and takes grouped union
lengths over one sort).
"""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from keras_dp_tools.analysis import analyze_xspace
from keras_dp_tools.analysis.breakdown import rows as rows_module
from keras_dp_tools.analysis.breakdown import spans as spans_module
from keras_dp_tools.analysis.breakdown import step_engine
from tests.helpers.xplane_builder import MS, SpaceBuilder

INPUT_NAME = "IteratorGetNextOp::DoCompute"  # a tf.data wait: shared by all replicas


def _compute_name(replica: int, op: int) -> str:
    scope = f"replica_{replica}/" if replica else ""
    return f"{scope}model/dense_{op}/MatMul:_MklMatMul"


def _collective_name(replica: int) -> str:
    suffix = f"_{replica}" if replica else ""  # the k-th copy is replica k's
    return f"adam/CollectiveReduceV2{suffix}:CollectiveReduceV2"


# -- the reference -------------------------------------------------------------------


def _union(intervals) -> list[tuple[int, int]]:
    merged: list[list[int]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def _length(intervals) -> int:
    return sum(end - start for start, end in _union(intervals))


def _clip(event, start, end):
    """The event's part inside [start, end), or None if it does not overlap."""
    if event["start"] < end and event["end"] > start:
        return max(event["start"], start), min(event["end"], end)
    return None


def reference_rows(steps, events, replicas, allreduce_bytes):
    """Per (step, replica): the docs' definitions, computed step by step."""
    rows = {}
    for step, (start, end) in steps.items():
        inside = []
        for event in events:
            clipped = _clip(event, start, end)
            if clipped is not None:
                clipped_event = {**event, "start": clipped[0], "end": clipped[1]}
                inside.append({**clipped_event, "real_start": event["start"]})
        # W: each collective's part before the last peer of the same operation started.
        # Peers: the same instance_key, else the i-th collective of each replica, in
        # order of start in the step, then of real start, then of trace order (the
        # list's: Python's sort is stable).
        collectives = [e for e in inside if e["kind"] == "collective"]
        peers: dict[object, list[dict]] = {}
        for replica in range(replicas):
            mine = sorted(
                (e for e in collectives if e["replica"] == replica),
                key=lambda e: (e["start"], e["real_start"]),
            )
            for ordinal, event in enumerate(mine):
                key = event["key"] if event["key"] is not None else ("nth", ordinal)
                peers.setdefault(key, []).append(event)
        waits = {replica: [] for replica in range(replicas)}
        for group in peers.values():
            last = max(e["start"] for e in group)
            for e in group:
                if len(group) > 1 and e["start"] < last:
                    waits[e["replica"]].append((e["start"], min(last, e["end"])))
        everything = [(e["start"], e["end"]) for e in inside]
        ran = [i for i in everything if i[1] > i[0]]
        t0 = min((i[0] for i in ran), default=end)
        t1 = max((i[1] for i in ran), default=end)
        idle = (t1 - t0) - _length(everything) if ran else 0
        for replica in range(replicas):

            def of(kind, replica=replica, inside=inside):
                return [
                    (e["start"], e["end"])
                    for e in inside
                    if e["kind"] == kind and e["replica"] in (replica, None)
                ]

            compute, inputs = of("compute"), of("input")
            comm = of("collective") if replicas > 1 else []
            wait = waits[replica]
            busy = _length(compute + comm)
            other = (end - start) - _length(compute + comm + inputs)
            exposed = busy - _length(compute)
            exposed_wait = _length(compute + wait) - _length(compute)
            transfer = _length(comm + wait) - _length(wait)
            dispatch = (t0 - start) + (end - t1)
            ms = 1 / MS
            row = {
                "step_ms": (end - start) * ms,
                "compute_ms": _length(compute) * ms,
                "allreduce_ms": _length(comm) * ms,
                "sync_wait_ms": _length(wait) * ms,
                "transfer_ms": (_length(comm) - _length(wait)) * ms,
                "exposed_allreduce_ms": exposed * ms,
                "exposed_sync_wait_ms": exposed_wait * ms,
                "exposed_transfer_ms": (exposed - exposed_wait) * ms,
                "input_ms": (_length(compute + comm + inputs) - busy) * ms,
                "other_ms": other * ms,
                "dispatch_ms": dispatch * ms,
                "idle_ms": idle * ms,
                "scheduling_ms": (other - dispatch - idle) * ms,
            }
            if replicas > 1 and transfer > 0 and comm:
                algbw = allreduce_bytes / (transfer * ms / 1e3) / 1e9
                row["busbw_gbps"] = algbw * 2 * (replicas - 1) / replicas
            else:
                row["busbw_gbps"] = None
            rows[(step, replica)] = row
    return rows


# -- random traces ---------------------------------------------------------------------


@st.composite
def traces(draw):
    replicas = draw(st.integers(1, 3))
    step_count = draw(st.integers(1, 4))
    steps, now = {}, 0
    for step in range(step_count):
        now += draw(st.integers(0, 3))
        length = draw(st.integers(1, 12))
        steps[step] = (now * MS, (now + length) * MS)
        now += length
    horizon = now + 2
    events = []

    def interval():
        start = draw(st.integers(-1, horizon))
        return start * MS, (start + draw(st.integers(0, 4))) * MS

    for replica in range(replicas):
        for op in range(draw(st.integers(0, 6))):
            start, end = interval()
            events.append(
                {"kind": "compute", "replica": replica, "start": start, "end": end, "op": op}
            )
    for _ in range(draw(st.integers(0, 3))):
        start, end = interval()
        events.append({"kind": "input", "replica": None, "start": start, "end": end})
    # Collectives: each one an op on every replica at its own time, peers by
    # instance_key or (unkeyed) by order.
    for instance in range(draw(st.integers(0, 3))):
        keyed = draw(st.booleans())
        for replica in range(replicas):
            start, end = interval()
            events.append(
                {
                    "kind": "collective",
                    "replica": replica,
                    "start": start,
                    "end": end,
                    "key": 100 + instance if keyed else None,
                }
            )
    return replicas, steps, events


def build(replicas, steps, events):
    builder = SpaceBuilder()
    for step, (start, end) in steps.items():
        builder.step(step, start / MS, end / MS)
    host = builder.host()
    for event in events:
        line = f"tf_Compute/{event['replica'] or 0}"
        start, end = event["start"] / MS, event["end"] / MS
        if event["kind"] == "compute":
            host.event(line, _compute_name(event["replica"], event["op"]), start, end)
        elif event["kind"] == "input":
            host.event(line, INPUT_NAME, start, end)
        elif event["key"] is None:
            host.event(line, _collective_name(event["replica"]), start, end)
        else:
            stats = {"instance_key": event["key"], "group_key": 1, "step_id": 7, "iter_id": 0}
            host.event(line, _collective_name(event["replica"]), start, end, **stats)
    return builder.space


_SETTINGS = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}


def _collective(replica, start_ms, end_ms):
    return {
        "kind": "collective",
        "replica": replica,
        "start": int(start_ms * MS),
        "end": int(end_ms * MS),
        "key": None,
    }


# Two unkeyed collectives of replica 0 clipped to the start of step 2 (both began in step
# 1), listed in the trace against the order they started in (the review's case).
TIE = (
    2,
    {1: (0, 10 * MS), 2: (10 * MS, 20 * MS)},
    [
        _collective(0, 9.5, 11.0),
        _collective(1, 10.5, 11.0),
        _collective(0, 9.0, 12.0),
        _collective(1, 13.0, 14.0),
    ],
)


def test_collectives_clipped_to_one_start_pair_up_by_real_start():
    """By hand: in step 2, replica 0's first collective is the one that started first
    (9.0-12.0, clipped to 10-12), peer of replica 1's 10.5-11: it waits 10-10.5. Its
    second (9.5-11.0, clipped to 10-11) is the peer of 13-14: it waits 10-11. The union
    is 1.0 ms (trace order would pair 9.5-11 first and give 0.5 + 2.0 -> 2.0 ms)."""
    replicas, steps, events = TIE
    breakdown = analyze_xspace(build(replicas, steps, events), local_replicas=replicas)
    waits = breakdown.replicas.set_index(["step", "replica"])["sync_wait_ms"]
    assert waits[(2, 0)] == pytest.approx(1.0)
    assert waits[(2, 1)] == 0
    assert waits[(1, 0)] == waits[(1, 1)] == 0  # replica 1 has no collective in step 1


@settings(max_examples=60, **_SETTINGS)
@given(traces())
@example(TIE)
def test_engine_matches_the_brute_force_reference_on_random_traces(trace):
    _check_against_reference(*trace)


@settings(max_examples=40, **_SETTINGS)
@given(traces())
def test_tiny_batches_and_index_blocks_lose_no_span(trace):
    """Batches of 3 spans and index blocks of 2: the steps' spans are found across many
    blocks of the running maximum of ends and split over many batches (real traces
    take blocks of 256 and batches of 32k spans, more than these small traces hold)."""
    with (
        mock.patch.object(rows_module, "BATCH_SPANS", 3),
        mock.patch.object(step_engine, "REACH_BLOCK", 2),
    ):
        _check_against_reference(*trace)


def _check_against_reference(replicas, steps, events):
    space = build(replicas, steps, events)
    breakdown = analyze_xspace(space, local_replicas=replicas, allreduce_bytes=4_000_000)
    expected = reference_rows(steps, events, replicas, 4_000_000)
    got = breakdown.replicas.set_index(["step", "replica"])
    assert sorted(got.index) == sorted(expected)
    for index, want in expected.items():
        row = got.loc[index]
        for column, value in want.items():
            if value is None:
                assert row[column] != row[column], (index, column)  # NaN: not shown
            else:
                assert row[column] == pytest.approx(value, abs=1e-9), (index, column)


def test_step_index_finds_every_span_of_a_window_beside_long_and_launched_spans():
    """The index's blocks against a brute-force overlap test, on spans of which some
    were launched by markers (found by marker, left out of the blocks' maxima) and a few
    last the whole trace; blocks of 4 spans, so the maxima are computed over many
    pieces (of 256 blocks) too."""
    rng = np.random.default_rng(7)
    count = 5_000
    start = np.sort(rng.integers(0, 10**6, count))
    end = start + rng.integers(0, 2_000, count)
    end[rng.choice(count, 3, replace=False)] = 2 * 10**6  # last past everything
    launched = np.where(rng.random(count) < 0.5, rng.integers(0, 50, count), -1)
    spans = spans_module.Spans(
        0,
        np.zeros(count, np.int8),
        np.zeros(count, np.int16),
        start,
        end,
        launched.astype(np.int32),
        np.ones(count, bool),
    )
    with mock.patch.object(step_engine, "REACH_BLOCK", 4):
        index = step_engine.StepIndex(spans)
        for first, stop, low, high in [(0, 5, 0, 10**4), (10, 12, 4 * 10**5, 5 * 10**5)]:
            found = set(index.spans(first, stop, low, high).tolist())
            by_time = (launched < 0) & (start < high) & (end > low)
            by_marker = (launched >= first) & (launched < stop)
            assert set(np.flatnonzero(by_time | by_marker).tolist()) <= found
            assert not any(launched[p] >= 0 and not by_marker[p] for p in found)
