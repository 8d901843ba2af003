"""Bytes and bandwidths of the collectives, as nccl-tests defines them.

``algbw = bytes / transfer time``; the bus bandwidth ``busbw = algbw * 2(n-1)/n`` for an
all-reduce and ``algbw * (n-1)/n`` for an all-gather of n ranks. A bus bandwidth above
the link's physical peak is not shown, and ``bandwidth_note`` says why one is empty.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from keras_dp_tools.analysis.breakdown import gpu_trace

# nccl-tests' bus bandwidth factors: busbw = algbw * factor(ranks).
_BUS_FACTORS = {
    "allreduce": lambda ranks: 2 * (ranks - 1) / ranks,
    "allgather": lambda ranks: (ranks - 1) / ranks,
}


def bus_bandwidth(nbytes, transfer_ms, ranks, collective="allreduce"):
    """nccl-tests' (algbw, busbw) in GB/s for ``nbytes`` moved in ``transfer_ms``
    (arrays; NaN where no bytes moved, no transfer time or no ranks)."""
    nbytes = np.asarray(nbytes, dtype=float)
    transfer_ms = np.asarray(transfer_ms, dtype=float)
    shown = (nbytes != 0) & ~np.isnan(nbytes) & (transfer_ms > 0) & bool(ranks)
    with np.errstate(divide="ignore", invalid="ignore"):
        algbw = np.where(shown, nbytes / (transfer_ms / 1e3) / 1e9, np.nan)
    return algbw, algbw * _BUS_FACTORS[collective](ranks) if ranks else algbw


def row_bandwidths(nbytes, transfer_ms, ranks, collective="allreduce"):
    """``bus_bandwidth`` of one row: (algbw, busbw), or (None, None)."""
    algbw, busbw = bus_bandwidth(nbytes or 0, transfer_ms or 0, ranks, collective)
    if np.isnan(algbw):
        return None, None
    return float(algbw), float(busbw)


def sizes_and_bandwidths(
    times: Mapping[str, np.ndarray], reduce_bytes, gather_bytes, bytes_known, ranks, peak_gbps
) -> dict[str, list]:
    """Per row: bytes of its all-reduce and all-gather (None where it has none, or with
    one rank), its total over the steps it covers, and each one's bandwidth from its own
    bytes and transfer time; a bandwidth above ``peak_gbps`` is left out and
    ``bandwidth_note`` says why the all-reduce bandwidth is empty.

    ``times``: ``reduce_ms``, ``gather_ms``, ``reduce_transfer_ms``,
    ``gather_transfer_ms`` and ``steps`` per row; ``reduce_bytes``, ``gather_bytes``,
    ``bytes_known``: per row (None: unknown). Columns come out as lists with None, for
    pandas to type as it types records.
    """
    multi = bool(ranks and ranks > 1)
    reduce_present = _known(reduce_bytes) & (times["reduce_ms"] > 0) & multi
    gather_present = _known(gather_bytes) & (times["gather_ms"] > 0) & multi
    reduce_values = np.where(reduce_present, _values(reduce_bytes), 0)
    gather_values = np.where(gather_present, _values(gather_bytes), 0)
    algbw, busbw = bus_bandwidth(reduce_values, times["reduce_transfer_ms"], ranks)
    too_fast = ~np.isnan(busbw) & (peak_gbps is not None) & (busbw > (peak_gbps or 0))
    shown = ~np.isnan(busbw) & ~too_fast
    gather_busbw = bus_bandwidth(gather_values, times["gather_transfer_ms"], ranks, "allgather")[1]
    gather_busbw[gather_busbw > (peak_gbps if peak_gbps is not None else np.inf)] = np.nan
    notes = np.full(len(shown), None, dtype=object)
    for row in np.flatnonzero(too_fast):
        notes[row] = gpu_trace.check_bandwidth(float(busbw[row]), peak_gbps)
    transfer = times["reduce_transfer_ms"]
    missing = np.select(
        [np.full(len(shown), not multi), ~np.asarray(bytes_known, dtype=bool), ~(transfer > 0)],
        [_NO_RANKS, NO_BYTES, NO_REDUCE],
        None,
    )
    notes = np.where(~shown & ~too_fast, missing, notes)
    total = (reduce_values + gather_values) * np.asarray(times["steps"], dtype=np.int64)
    return {
        "allreduce_bytes": _nullable(reduce_values, reduce_present),
        "gather_bytes": _nullable(gather_values, gather_present),
        "row_bytes": _nullable(total, total != 0),
        "algbw_gbps": _nullable(algbw, shown),
        "busbw_gbps": _nullable(busbw, shown),
        "gather_busbw_gbps": _nullable(gather_busbw, ~np.isnan(gather_busbw)),
        "bandwidth_note": notes.tolist(),
    }


_NO_RANKS = "one replica: nothing to all-reduce"
NO_BYTES = "all-reduce bytes unknown (pass allreduce_bytes)"
NO_REDUCE = "no all-reduce collective ran in this step"


def _known(values) -> np.ndarray:
    return np.array([value is not None for value in values], dtype=bool)


def _values(values) -> np.ndarray:
    """Python numbers (None: 0) as an array of their own type (int or float)."""
    return np.array([0 if value is None else value for value in values])


def _nullable(values: np.ndarray, present: np.ndarray) -> list:
    """``values`` as Python numbers, None where not ``present``."""
    return [
        value if keep else None
        for value, keep in zip(values.tolist(), present.tolist(), strict=True)
    ]
