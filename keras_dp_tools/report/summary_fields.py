"""The run summary as people read it, defined once: each ``Report.summary()`` column's
label, unit and how its value is written, and the "How to read it" note under it.

``Report.text()``, ``keras-dp report``, the HTML page, the TensorBoard dashboard and the
notebook (``plots.summary_table``) all show this table, so a label, a unit or a rounding
is changed here, once. ``Report.summary()`` itself stays numeric (shares as fractions),
for code.

Example:

```python
import keras_dp_tools as kdt
from keras_dp_tools.report import summary_fields

report = kdt.Report.load("runs/demo-20261129-093000")
table = summary_fields.summary_table(report.summary(advice=False))
print(table[table["field"] == "comm_share"])  # Communication share, %, e.g. 7.2
print("\\n".join(summary_fields.summary_text(table)))
```
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

# What a cell shows where the run has no value (no profiler window, no GPU, no batch).
NOT_MEASURED = "not measured"

# Under the summary in every view (a title and at most five lines); docs/reading.md
# says the same at length.
READING_TITLE = "How to read it"
READING_NOTE = (
    "Step times and throughput: over the timed steps; those left out ran while a profiler "
    "or its trace's analysis did (or, across workers, have no job step time).",
    "Compute to bus bandwidth: medians over the profiled steps; they do not add up to the "
    "step time.",
    "Communication share: exposed all-reduce transfer only (not hidden by compute), % of the "
    "profiled step.",
    "Wait share: exposed wait for the slowest replica or worker, % of the profiled step.",
    "More: keras-dp docs reading (Reading the numbers).",
)


# Below these a nonzero value would print as "1e-05" or "0.0": it is shown as "<0.001"
# and "<0.1" (%), so that something measured does not read as nothing.
_SMALLEST_NUMBER = 0.001
_SMALLEST_PERCENT = 0.05


def number_text(value) -> str:
    """A measured number as the views write it.

    Args:
        value: a number.

    Returns:
        Thousands separated from 100 up ("12,345"), else 3 digits; "<0.001" for a
        positive value under 0.001 (">-0.001" for a negative one).

    Example:

    >>> from keras_dp_tools.report.summary_fields import number_text
    >>> number_text(12345.6), number_text(3.14159), number_text(0.00002)
    ('12,346', '3.14', '<0.001')
    """
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if 0 < abs(value) < _SMALLEST_NUMBER:
        return f"<{_SMALLEST_NUMBER}" if value > 0 else f">-{_SMALLEST_NUMBER}"
    return f"{value:.3g}"


def percent_text(share) -> str:
    """A fraction in percent, one decimal.

    Args:
        share: a fraction (0.072 for 7.2%).

    Returns:
        The percentage as text; "<0.1" for a share above 0 that would round to "0.0".

    Example:

    >>> from keras_dp_tools.report.summary_fields import percent_text
    >>> percent_text(0.072), percent_text(0.0002)
    ('7.2', '<0.1')
    """
    if 0 < 100 * share < _SMALLEST_PERCENT:
        return "<0.1"
    return f"{100 * share:.1f}"


def count_text(value) -> str:
    """A count, thousands separated.

    Args:
        value: a whole number.

    Returns:
        The count as text.

    Example:

    >>> from keras_dp_tools.report.summary_fields import count_text
    >>> count_text(100000)
    '100,000'
    """
    return f"{int(value):,}"


def _time(time) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


@dataclass(frozen=True)
class SummaryField:
    """One ``Report.summary()`` column as people read it.

    Attributes:
        label: what the column is, in words.
        unit: its unit ("" for counts and names).
        write: the value as text (a share as a percentage).

    Example:

    >>> from keras_dp_tools.report.summary_fields import SUMMARY_FIELDS
    >>> field = SUMMARY_FIELDS["comm_share"]
    >>> field.label, field.shown(0.072), field.unit, field.shown(None)
    ('Communication share', '7.2', '%', 'not measured')
    """

    label: str
    unit: str
    write: Callable[[object], str]

    def shown(self, value) -> str:
        """``value`` as the views show it: ``NOT_MEASURED`` for NaN or None."""
        if value is None or (not isinstance(value, str) and pd.isna(value)):
            return NOT_MEASURED
        return self.write(value)


# Every Report.summary() column but ``advice``, in the summary's order.
SUMMARY_FIELDS = {
    "start": SummaryField("Start", "UTC", _time),
    "workers": SummaryField("Workers", "", count_text),
    "replicas": SummaryField("Replicas", "", count_text),
    "global_batch": SummaryField("Global batch", "examples", count_text),
    "steps": SummaryField("Steps (warm-up left out)", "", count_text),
    "measured_steps": SummaryField("Steps timed (behind the step times)", "", count_text),
    "left_out_steps": SummaryField("Steps left out of the step times", "", count_text),
    "breakdown_steps": SummaryField("Steps behind the breakdown (profiled)", "", count_text),
    "median_step_ms": SummaryField("Median step time", "ms", number_text),
    "p90_step_ms": SummaryField("90th percentile step time", "ms", number_text),
    "examples_per_s": SummaryField("Throughput", "examples/s", number_text),
    "step_time_from": SummaryField("Step times from (column of Report.steps)", "", str),
    "compute_ms": SummaryField("Compute", "ms", number_text),
    "allreduce_ms": SummaryField("All-reduce (wait + transfer)", "ms", number_text),
    "gather_ms": SummaryField("All-gather of sparse gradients", "ms", number_text),
    "exposed_allreduce_ms": SummaryField("All-reduce not hidden by compute", "ms", number_text),
    "sync_wait_ms": SummaryField("Sync wait (for the slowest replica)", "ms", number_text),
    "input_ms": SummaryField("Input", "ms", number_text),
    "other_ms": SummaryField("Other (host, launch, idle)", "ms", number_text),
    "comm_share": SummaryField("Communication share", "%", percent_text),
    "wait_share": SummaryField("Wait share", "%", percent_text),
    "busbw_gbps": SummaryField("All-reduce bus bandwidth", "GB/s", number_text),
    "gpu_util": SummaryField("GPU utilization", "%", number_text),
}


def field_of(column: str) -> SummaryField:
    """The label, unit and writer of a summary column.

    Args:
        column: a column of ``Report.summary()``.

    Returns:
        Its ``SummaryField``; a column this table does not know yet is shown under its
        own name (tests/test_schema_coverage.py catches it).
    """
    return SUMMARY_FIELDS.get(column, SummaryField(column, "", str))


def summary_table(summary: pd.DataFrame) -> pd.DataFrame:
    """``summary`` (``Report.summary(advice=False)``, one row per run) as people read it:
    one row per field with columns ``field`` (the summary's column), ``label``, ``unit``
    and the value as shown, one column per run (``value`` when there is one run).

    Args:
        summary: ``Report.summary()``; an ``advice`` column is left out.

    Returns:
        The table, one row per field.

    Example:

    ```python
    table = summary_table(report.summary(advice=False))
    table.loc[table["field"] == "comm_share", "value"]  # "7.2" for a share of 0.072
    ```
    """
    fields = [column for column in summary.columns if column != "advice"]
    table = pd.DataFrame(
        {
            "field": fields,
            "label": [field_of(column).label for column in fields],
            "unit": [field_of(column).unit for column in fields],
        }
    )
    runs = [str(run) for run in summary.index]
    names = ["value"] if len(runs) == 1 else runs
    for name, (_, row) in zip(names, summary.iterrows(), strict=True):
        table[name] = [field_of(column).shown(row[column]) for column in fields]
    return table


def value_columns(table: pd.DataFrame) -> list[str]:
    """The columns of ``summary_table`` that hold values: one per run.

    Args:
        table: what ``summary_table`` returned.

    Returns:
        Their names, in order.
    """
    return [column for column in table.columns if column not in ("field", "label", "unit")]


def summary_text(table: pd.DataFrame) -> list[str]:
    """``summary_table`` as aligned text lines: label, the value of each run, unit, and
    the ``Report.summary()`` column (for code and docs/reading.md); then the note.

    Args:
        table: what ``summary_table`` returned.

    Returns:
        The lines, without newlines.
    """
    values = value_columns(table)
    header = ["", *values, "unit", "column"]
    rows = [
        [row["label"], *(row[name] for name in values), row["unit"], row["field"]]
        for _, row in table.iterrows()
    ]
    widths = [max(len(str(cells[i])) for cells in [header, *rows]) for i in range(len(header))]

    def aligned(cells) -> str:
        label, *middle, unit, field = cells
        parts = [label.ljust(widths[0])]
        parts += [str(c).rjust(w) for c, w in zip(middle, widths[1:-2], strict=True)]
        parts += [unit.ljust(widths[-2]), field]
        return "  ".join(parts).rstrip()

    note = [f"{READING_TITLE}:", *(f"- {sentence}" for sentence in READING_NOTE)]
    return [aligned(header), *(aligned(cells) for cells in rows), "", *note]
