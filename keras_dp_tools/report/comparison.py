"""A strategy comparison as people read it, defined once: the labelled table (candidate,
status, examples/s and their spread over rounds, speed-up, step time, exposed
communication, bytes per step and their source), and the comparisons a log dir holds.

``print(kdt.StrategyComparison)``, its notebook table, the HTML report and the
dashboard's "Strategy comparison" section all show ``display_table``, so a label, a
unit or a rounding is changed here, once. The numbers themselves stay in
``StrategyComparison.table`` (``keras_dp_tools.analysis.strategies``).

Example:

```python
from keras_dp_tools.report import comparison

for found in comparison.load_comparisons("runs/strategies"):
    print(found.verdict)
    print(comparison.display_table(found.table).to_string(index=False))
```
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from keras_dp_tools.analysis import strategies as analysis
from keras_dp_tools.records.comparison import comparison_path, find_comparisons, read_comparison
from keras_dp_tools.report.summary_fields import (
    NOT_MEASURED,
    SummaryField,
    count_text,
    number_text,
    percent_text,
)


def _bytes(value) -> str:
    """Decimal units, as the verdict writes them (``analysis.strategies``)."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value:.0f} B"


# The table's columns as people read them, in this order: label, unit, how a value is
# written ("not measured" where it is NaN). Status and bytes combine two columns.
DISPLAY_FIELDS = {
    "candidate": SummaryField("Candidate", "", str),
    "label": SummaryField("Strategy", "", str),
    "status": SummaryField("Status", "", str),
    "replicas": SummaryField("Replicas", "", count_text),
    "global_batch": SummaryField("Global batch", "examples", count_text),
    "examples_per_s": SummaryField("Examples/s", "", number_text),  # median over rounds
    # The whole range of the rounds' rates (not a ± half of it), over their median.
    "spread_pct": SummaryField("Spread, slowest to fastest round", "% of median", number_text),
    "speedup": SummaryField("Speed-up", f"x {analysis.BASELINE}", lambda value: f"{value:.2f}"),
    "step_ms": SummaryField("Step time", "ms", number_text),  # the timed rounds
    # From the profiled step, not from "Step time": the labels say so, as comm_ms over
    # step_ms is not comm_share.
    "comm_ms": SummaryField("Exposed comm, profiled step", "ms", number_text),
    "comm_share": SummaryField("Comm share of profiled step", "%", percent_text),
    "bytes_per_step": SummaryField("Bytes per step", "source", _bytes),
}
# Columns of text (left-aligned); the others hold numbers.
TEXT_COLUMNS = ("candidate", "label", "status")


def heading(column: str) -> str:
    """A column's header: its label, and its unit in parentheses.

    Args:
        column: a key of ``DISPLAY_FIELDS`` (a column of ``StrategyComparison.table``).

    Returns:
        The header text.

    Raises:
        KeyError: ``column`` is no displayed column.
    """
    shown = DISPLAY_FIELDS[column]
    return f"{shown.label} ({shown.unit})" if shown.unit else shown.label


def text_headings() -> list[str]:
    """The headers of ``display_table``'s text columns (left-aligned in every view).

    Returns:
        Their headers, in ``TEXT_COLUMNS`` order.
    """
    return [heading(column) for column in TEXT_COLUMNS]


def display_table(table: pd.DataFrame, reasons: bool = True) -> pd.DataFrame:
    """``table`` (``StrategyComparison.table``) for people: one row per candidate, in the
    table's order, a column per ``DISPLAY_FIELDS`` entry headed by its label and unit,
    every cell text: counts with thousands separators, shares in %, the bytes with
    their source ("330.8 kB (model sizes)"), "not measured" where there is no number.

    Args:
        table: the comparison's table (``analysis.strategies.comparison_table``).
        reasons: put a failed or skipped candidate's reason in its status
            ("failed: timed out after 30 s"); False where the reasons are listed apart.

    Example:

    ```python
    shown = display_table(comparison.table)
    shown.loc[0, "Examples/s"]  # "12,345" for 12345.2
    ```
    """
    columns = {}
    for column, shown in DISPLAY_FIELDS.items():
        columns[heading(column)] = [shown.shown(value) for value in table[column]]
    status = heading("status")
    if reasons:
        columns[status] = [
            f"{row.status}: {row.reason}" if isinstance(row.reason, str) else row.status
            for row in table.itertuples()
        ]
    columns[heading("bytes_per_step")] = [
        f"{shown} ({source})" if shown != NOT_MEASURED and isinstance(source, str) else shown
        for shown, source in zip(
            columns[heading("bytes_per_step")], table["bytes_source"], strict=True
        )
    ]
    return pd.DataFrame(columns)


@dataclass(frozen=True)
class RecordedComparison:
    """A comparison recorded in a log dir (``strategy_comparison.json``), as the HTML
    report and the dashboard show it; ``kdt.StrategyComparison.load`` reads the same
    record for code.

    Attributes:
        log_dir: the folder of the record.
        where: that folder relative to the log dir it was found under ("" for the
            log dir itself).
        table: the candidates' numbers (``StrategyComparison.table``).
        best: the fastest measured candidate (None when none was measured).
        verdict: the verdict sentence; ``note``: why the speed-ups are empty, if they are.
        code: the lines that build the winner's strategy.
        record: the record itself.

    Example:

    ```python
    from keras_dp_tools.report.comparison import load_comparisons

    for comparison in load_comparisons("runs"):
        print(comparison.where or ".", comparison.best, comparison.verdict)
    ```
    """

    log_dir: Path
    where: str
    table: pd.DataFrame
    best: str | None
    verdict: str
    code: str | None
    record: dict = field(repr=False)

    @classmethod
    def load(cls, log_dir: str | os.PathLike, root: str | os.PathLike | None = None):
        """The comparison recorded in ``log_dir`` (found under ``root``, default itself).
        Raises ValueError naming the file when it is not a comparison record or its
        table cannot be read."""
        record = read_comparison(log_dir)
        if record is None:
            raise FileNotFoundError(
                f"No strategy comparison in {log_dir} (no strategy_comparison.json): run "
                "kdt.compare_strategies(..., log_dir=...) or keras-dp compare-strategies."
            )
        try:
            table = analysis.table_from_record(record)
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise ValueError(
                f"{comparison_path(log_dir)} is not a readable strategy comparison record: "
                f"its table could not be read ({type(error).__name__}: {error}). Rerun "
                "compare_strategies to write it again, or remove the file."
            ) from None
        where = Path(log_dir).relative_to(root) if root is not None else Path()
        return cls(
            log_dir=Path(log_dir),
            where="" if str(where) == "." else where.as_posix(),
            table=table,
            best=record.get("best"),
            verdict=record.get("verdict") or "",
            code=record.get("code"),
            record=record,
        )

    @property
    def title(self) -> str:
        return f"Strategy comparison ({self.where})" if self.where else "Strategy comparison"

    @property
    def note(self) -> str | None:
        return analysis.speedup_note(self.table)

    def settings_line(self) -> str:
        """When and how it was measured, in one line."""
        settings = self.record.get("settings") or {}
        parts = [f"recorded {self.record['time']}"] if self.record.get("time") else []
        if settings.get("steps") and settings.get("rounds"):
            steps, rounds = settings["steps"], settings["rounds"]
            parts.append(f"{steps} timed steps per candidate in {rounds} rounds")
        if settings.get("per_replica_batch"):
            parts.append(f"{settings['per_replica_batch']} examples per replica per step")
        if settings.get("gpus"):
            parts.append(f"GPUs {', '.join(map(str, settings['gpus']))}")
        elif settings.get("cpu_devices"):
            parts.append(f"{settings['cpu_devices']} logical CPU devices")
        return "; ".join(parts)


def load_comparisons(
    log_dirs: str | os.PathLike | Iterable[str | os.PathLike],
    errors: list[str] | None = None,
) -> list[RecordedComparison]:
    """Every strategy comparison recorded under ``log_dirs`` (searched recursively, as
    ``Report.load`` searches records), in path order.

    Args:
        log_dirs: a log dir or several.
        errors: a list that collects why a record could not be read (the message names
            the file); that record is left out and the others are returned. None
            (default): such a record raises ValueError naming it.

    Returns:
        The comparisons, in path order.

    Raises:
        ValueError: a record could not be read and ``errors`` is None.

    Example:

    ```python
    errors = []
    found = load_comparisons("runs", errors=errors)  # the good ones
    for error in errors:
        print("left out:", error)
    ```
    """
    if isinstance(log_dirs, (str, os.PathLike)):
        log_dirs = [log_dirs]
    found = []
    for root in log_dirs:
        for folder in find_comparisons(root):
            try:
                found.append(RecordedComparison.load(folder, root))
            except (OSError, ValueError) as error:  # a record being replaced, a bad one
                if errors is None:
                    raise
                errors.append(f"{type(error).__name__}: {error}")
    return found
