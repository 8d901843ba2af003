"""The breakdown's rows: per step and replica from the engine's union lengths, and per
step as the mean over replicas, with the bytes and bandwidths of each.

``compute_ms + exposed_allreduce_ms + input_ms + other_ms == step_ms`` exactly; every time
is per step (a marker covering k steps has its times divided by k).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from keras_dp_tools.analysis.breakdown.bandwidth import sizes_and_bandwidths
from keras_dp_tools.analysis.breakdown.spans import Spans
from keras_dp_tools.analysis.breakdown.step_engine import StepIndex, batch_lengths
from keras_dp_tools.records.columns import MEAN_COLUMNS, REPLICA_COLUMNS, STEP_COLUMNS
from keras_dp_tools.records.facts import RunFacts

BANDWIDTH_COLUMNS = ["algbw_gbps", "busbw_gbps", "gather_busbw_gbps"]  # NaN where not shown
# All-reduce time alone and its transfer part: what the all-reduce bandwidth divides by.
_BANDWIDTH_TIMES = ["reduce_ms", "reduce_transfer_ms"]

# the spans it holds) while keeping numpy's per-call overhead small.
BATCH_SPANS = 1 << 15


def replica_frame(
    markers,
    spans: Spans,
    replica_count: int,
    facts: RunFacts,
    peak_gbps,
    release_memory,
    unmeasured: Mapping[int, str],
    device_names: Sequence[str] = (),
    step_source: str | None = None,
):
    """One row per step and replica (``REPLICA_COLUMNS`` and ``_BANDWIDTH_TIMES``).
    Vectorised over steps: each span is assigned to its steps once, then the union
    lengths of all (step, replica) groups come from one sort, batch by batch of
    markers. The rows of the markers in ``unmeasured`` have empty times, sizes and
    bandwidths, and their note as ``bandwidth_note``; bandwidths are floats (NaN: not
    shown). The collectives' ranks: ``facts.ranks(replica_count)``. ``device_names``:
    each replica's device (else ``facts.devices``); ``step_source``: where the markers
    came from (``step_sources.STEP_SOURCES``)."""
    columns = [*REPLICA_COLUMNS, *_BANDWIDTH_TIMES]
    if not markers:
        return pd.DataFrame([], columns=columns).astype(dict.fromkeys(BANDWIDTH_COLUMNS, float))
    count = len(markers)
    origin = spans.origin_ps
    step_start = np.fromiter((m.start_ps - origin for m in markers), np.int64, count)
    marker_ends = np.fromiter((m.end_ps - origin for m in markers), np.int64, count)
    index = StepIndex(spans)
    key_ids, iteration_ids = spans.key_ids
    ranks = facts.ranks(replica_count)
    multi = bool(ranks and ranks > 1)
    per_batch = max(1, BATCH_SPANS * count // max(len(spans.kind), 1))
    batches = []
    for first in range(0, count, per_batch):
        stop = min(first + per_batch, count)
        candidates = index.spans(
            first, stop, int(step_start[first]), int(marker_ends[first:stop].max())
        )
        batches.append(
            batch_lengths(
                step_start[first:stop],
                marker_ends[first:stop],
                spans,
                candidates,
                first,
                replica_count,
                (key_ids, iteration_ids),
                multi,
            )
        )
    del index, key_ids, iteration_ids, spans  # gone before the rows are built (take_spans)
    release_memory()
    lengths = {name: np.concatenate([batch[name] for batch in batches]) for name in batches[0]}
    step_end = lengths.pop("step_end")
    steps = np.array(
        [
            facts.steps_covered.get(m.step) or int(n)
            for m, n in zip(markers, lengths.pop("iterations"), strict=True)
        ],
        dtype=np.int64,
    )
    has_gathers = lengths.pop("has_gathers")
    dispatch, idle = lengths.pop("dispatch"), lengths.pop("idle")
    compute, comm, wait = lengths["compute"], lengths["comm"], lengths["wait"]
    busy, busy_or_input = lengths["busy"], lengths["busy_or_input"]
    replicas = np.arange(replica_count)
    rows = count * replica_count
    # Set algebra on lengths: |A - B| = |A + B| - |B|, |A & B| = |A| + |B| - |A + B|.
    exposed_comm = busy - compute
    exposed_wait = lengths["compute_or_wait"] - compute
    per_row = np.repeat  # a step's value on each of its replicas' rows
    length = per_row(step_end - step_start, replica_count)
    other = length - busy_or_input
    to_ms = per_row(1e-9 / steps, replica_count)  # picoseconds of a call to ms per step
    row_dispatch, row_idle = per_row(dispatch, replica_count), per_row(idle, replica_count)
    step_ms = length * to_ms
    exposed_transfer_ms = (exposed_comm - exposed_wait) * to_ms
    exposed_sync_wait_ms = exposed_wait * to_ms
    nonzero = step_ms != 0
    with np.errstate(divide="ignore", invalid="ignore"):
        comm_share = np.where(nonzero, exposed_transfer_ms / step_ms, np.nan)
        wait_share = np.where(nonzero, exposed_sync_wait_ms / step_ms, np.nan)
    row_replica = np.tile(replicas, count)
    names = list(device_names or facts.devices or ())
    frame = {
        "step": per_row(np.array([m.step for m in markers], dtype=np.int64), replica_count),
        "replica": row_replica,
        "device": [
            names[replica] if replica < len(names) else None for replica in row_replica.tolist()
        ],
        "steps": per_row(steps, replica_count),
        "step_ms": step_ms,
        "compute_ms": compute * to_ms,
        "allreduce_ms": comm * to_ms,
        "sync_wait_ms": wait * to_ms,
        "transfer_ms": (comm - wait) * to_ms,
        "gather_ms": lengths["gather"] * to_ms,
        "gather_transfer_ms": (lengths["gather_or_wait"] - wait) * to_ms,
        "exposed_allreduce_ms": exposed_comm * to_ms,
        "exposed_sync_wait_ms": exposed_sync_wait_ms,
        "exposed_transfer_ms": exposed_transfer_ms,
        "input_ms": (busy_or_input - busy) * to_ms,
        "other_ms": other * to_ms,
        "dispatch_ms": row_dispatch * to_ms,
        "idle_ms": row_idle * to_ms,
        "scheduling_ms": (other - row_dispatch - row_idle) * to_ms,
        "comm_share": comm_share,
        "wait_share": wait_share,
        "reduce_transfer_ms": (lengths["reducing_or_wait"] - wait) * to_ms,
        "reduce_ms": lengths["reduce"] * to_ms,
    }
    blank = per_row(np.isin(np.arange(count), list(unmeasured)), replica_count)
    if blank.any():  # empty times give empty sizes and bandwidths below
        names = list(frame)
        for name in names[names.index("step_ms") :]:
            frame[name] = np.where(blank, np.nan, frame[name])
    # The all-reduce moves less in a step with gathers: the sparse gradients go there.
    reduce_bytes = facts.allreduce_bytes
    step_bytes = [
        reduce_bytes - facts.sparse_bytes
        if gathers and reduce_bytes and facts.sparse_bytes
        else reduce_bytes
        for gathers in has_gathers.tolist()
    ]
    row_bytes = [value for value in step_bytes for _ in range(replica_count)]
    frame.update(
        sizes_and_bandwidths(
            frame,
            row_bytes,
            [facts.gather_bytes] * rows,
            [bool(value) for value in row_bytes],
            ranks,
            peak_gbps,
        )
    )
    for marker, note in unmeasured.items():
        first = marker * replica_count
        frame["bandwidth_note"][first : first + replica_count] = [note] * replica_count
    frame["step_source"] = [step_source] * rows
    return pd.DataFrame(frame)[columns].astype(dict.fromkeys(BANDWIDTH_COLUMNS, float))


def step_rows(
    replica_frame: pd.DataFrame,
    facts: RunFacts,
    ranks: int,
    peak_gbps: float | None = None,
    untrue_steps: Mapping[int, str] | None = None,
) -> pd.DataFrame:
    """One row per step; ``ranks``: of each collective. ``untrue_steps``: the note of
    each step number one of whose markers cannot be true; its row is empty but for
    that note."""
    if replica_frame.empty:
        return pd.DataFrame(columns=STEP_COLUMNS)
    grouped = replica_frame.groupby("step", sort=True)
    steps = grouped[[*MEAN_COLUMNS, *_BANDWIDTH_TIMES]].mean()
    steps.insert(0, "step_ms", grouped["step_ms"].first())
    steps.insert(0, "steps", grouped["steps"].first())
    steps.insert(0, "replicas", grouped["replica"].nunique())
    steps["max_sync_wait_ms"] = grouped["sync_wait_ms"].max()
    steps["step_source"] = grouped["step_source"].first()
    # The replica the others waited for arrived last, so it waited least itself.
    measured = replica_frame.dropna(subset=["sync_wait_ms"])  # not the unmeasured steps
    waits = measured.groupby("step", sort=True)["sync_wait_ms"]
    straggler = measured.loc[waits.idxmin(), ["step", "replica"]].set_index("step")["replica"]
    steps["straggler_replica"] = straggler.reindex(steps.index).where(steps["max_sync_wait_ms"] > 0)
    # The step's bandwidth: its bytes over the replicas' mean all-reduce transfer time.
    times = {name: steps[name].to_numpy() for name in steps.columns}
    sizes = sizes_and_bandwidths(
        times,
        _group_max(replica_frame, grouped, "allreduce_bytes"),
        _group_max(replica_frame, grouped, "gather_bytes"),
        [bool(facts.allreduce_bytes)] * len(steps),
        ranks,
        peak_gbps,
    )
    for column, values in pd.DataFrame(sizes, index=steps.index).items():
        steps[column] = values
    # A step number may be marked more than once (tf_keras numbers steps within the
    # epoch): if one of its markers cannot be true, the row is empty too, as a mean of
    # the others would be shown as the step that ``Breakdown.unmeasured`` names.
    if untrue_steps:
        notes = pd.Series(untrue_steps, dtype=object)
        keep = ~steps.index.isin(notes.index)
        for name in steps.columns[steps.columns.get_loc("step_ms") :].drop(
            ["bandwidth_note", "step_source"]
        ):
            steps[name] = steps[name].where(keep)  # an int column (bytes) turns float
        steps.loc[notes.index, "bandwidth_note"] = notes
    steps = steps.astype(dict.fromkeys(BANDWIDTH_COLUMNS, float))
    steps["straggler_replica"] = steps["straggler_replica"].astype("Int64")
    return steps.reset_index()[STEP_COLUMNS]


def _group_max(frame: pd.DataFrame, grouped, column: str) -> list:
    """Per group, the largest value of a column of numbers or None, as Python values
    (None where the group has none); object columns are taken as integers."""
    values = frame[column]
    if values.dtype == object:
        if values.isna().all():
            return [None] * grouped.ngroups
        maxima = values.astype("Int64").groupby(frame["step"], sort=True).max()
        return [None if pd.isna(value) else int(value) for value in maxima.tolist()]
    return [None if pd.isna(value) else value for value in grouped[column].max().tolist()]
