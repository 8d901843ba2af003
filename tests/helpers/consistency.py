"""The rules every breakdown row obeys, checked on any frame of rows: the tests' oracle.

The analyzer's rows should satisfy them; records edited by hand, written by another tool
or made up for a test may not. ``breakdown_problems`` names each broken rule with the
row, so neither the analyzer nor a fixture can contradict the definitions in
docs/breakdown.md unnoticed.

Example:

```python
import keras_dp_tools as kdt
from tests.helpers.consistency import breakdown_problems

report = kdt.Report.load("logs/run1")
print(breakdown_problems(report.replicas))  # [] when the records are consistent
```
"""

from __future__ import annotations

import math

import pandas as pd

# (whole, parts): the parts add up to the whole.
_SUMS = [
    ("step_ms", ("compute_ms", "exposed_allreduce_ms", "input_ms", "other_ms")),
    ("allreduce_ms", ("sync_wait_ms", "transfer_ms")),
    ("exposed_allreduce_ms", ("exposed_sync_wait_ms", "exposed_transfer_ms")),
    ("other_ms", ("dispatch_ms", "idle_ms", "scheduling_ms")),
]
# (part, whole): the part is never more than the whole.
_BOUNDS = [
    ("exposed_allreduce_ms", "allreduce_ms"),
    ("exposed_sync_wait_ms", "sync_wait_ms"),
    ("exposed_transfer_ms", "transfer_ms"),
    ("gather_ms", "allreduce_ms"),
    ("gather_transfer_ms", "transfer_ms"),
    ("gather_transfer_ms", "gather_ms"),
    ("allreduce_ms", "step_ms"),
    ("compute_ms", "step_ms"),
    ("sync_wait_ms", "max_sync_wait_ms"),
]
# (share, numerator): share = numerator / step time.
_SHARES = [("comm_share", "exposed_transfer_ms"), ("wait_share", "exposed_sync_wait_ms")]


def _value(row, name):
    value = row.get(name)
    if value is None or value is pd.NA:
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def _close(first, second, tolerance) -> bool:
    return abs(first - second) <= tolerance * max(1.0, abs(first), abs(second))


def breakdown_problems(
    frame: pd.DataFrame,
    *,
    step_column: str = "step_ms",
    ranks: int | None = None,
    tolerance: float = 1e-6,
) -> list[str]:
    """Every broken rule in ``frame`` (replica or step rows), as readable lines.

    Columns a frame lacks, and empty cells, are not checked.

    Args:
        frame: rows with breakdown columns (``Breakdown.replicas`` / ``.steps``,
            ``Report.replicas``, or ``Report.steps``).
        step_column: the column holding the row's step time (``trace_step_ms`` in
            ``Report.steps``, where ``step_ms`` is the host's wall time).
        ranks: ranks of the collectives, for the bus bandwidth; by default the
            row's ``replicas``.
        tolerance: relative tolerance (against values of at least 1).
    """
    problems = []
    for index, row in frame.iterrows():
        values = {name: _value(row, name) for name in row.index}
        values["step_ms"] = _value(row, step_column)
        where = f"row {index} (step {row.get('step')}, replica {row.get('replica', '-')})"
        for name, value in values.items():
            measured = name.endswith(("_ms", "_bytes", "_gbps", "_share"))
            if measured and value is not None and value < -tolerance:
                problems.append(f"{where}: {name} = {value} is negative")
        for whole, parts in _SUMS:
            known = [values.get(part) for part in parts]
            if values.get(whole) is None or None in known:
                continue
            if not _close(values[whole], sum(known), tolerance):
                problems.append(
                    f"{where}: {' + '.join(parts)} = {sum(known):g}, not {whole} = "
                    f"{values[whole]:g}"
                )
        for part, whole in _BOUNDS:
            if values.get(part) is None or values.get(whole) is None:
                continue
            if values[part] > values[whole] + tolerance * max(1.0, values[whole]):
                problems.append(f"{where}: {part} = {values[part]:g} > {whole} = {values[whole]:g}")
        for share, numerator in _SHARES:
            if None in (values.get(share), values.get(numerator), values.get("step_ms")):
                continue
            expected = values[numerator] / values["step_ms"] if values["step_ms"] else 0.0
            if not _close(values[share], expected, tolerance):
                problems.append(f"{where}: {share} = {values[share]:g}, not {expected:g}")
        problems += _byte_problems(values, ranks or values.get("replicas"), where, tolerance)
    return problems


def _byte_problems(values, ranks, where, tolerance) -> list[str]:
    from keras_dp_tools.analysis.breakdown.bandwidth import row_bandwidths

    problems = []
    steps = values.get("steps")
    parts = [values.get("allreduce_bytes"), values.get("gather_bytes")]
    if steps is not None and values.get("row_bytes") is not None:
        expected = steps * sum(part or 0 for part in parts)
        if not _close(values["row_bytes"], expected, tolerance):
            problems.append(f"{where}: row_bytes = {values['row_bytes']:g}, not steps x bytes")
    if not ranks:
        return problems
    # The all-reduce's bandwidth comes from the all-reduce collectives' own transfer
    # time, which is not a column: it is at most transfer_ms (copies and, without
    # gathers, nothing else share it), so the bandwidth is at least bytes / transfer_ms.
    reduce_transfer = values.get("transfer_ms") if not values.get("gather_ms") else None
    checks = [
        ("busbw_gbps", parts[0], reduce_transfer, "allreduce", "at least"),
        ("gather_busbw_gbps", parts[1], values.get("gather_transfer_ms"), "allgather", "exactly"),
    ]
    for column, nbytes, seconds, collective, rule in checks:
        if values.get(column) is None or seconds is None:
            continue
        expected = row_bandwidths(nbytes, seconds, int(ranks), collective)[1]
        follows = expected is not None and (
            _close(values[column], expected, 1e-3)
            or (rule == "at least" and values[column] > expected)
        )
        if not follows:
            problems.append(
                f"{where}: {column} = {values[column]:g} does not follow from its bytes "
                f"and transfer time ({rule} {expected})"
            )
    return problems
