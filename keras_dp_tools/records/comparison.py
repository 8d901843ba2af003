"""The record of a strategy comparison: ``<log_dir>/strategy_comparison.json``.

``compare_strategies`` writes it once, at the end (to a temporary name, then renamed,
so a reader never sees half a file); the report and the dashboard find a comparison in
a log dir by it. One JSON object: ``schema_version``, ``kind``, ``time`` (ISO 8601,
UTC), ``table`` (one object per candidate, null where a number is unknown), ``verdict``,
``best``, ``code``, ``settings`` and ``versions``.

Standard library only.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

COMPARISON_FILE = "strategy_comparison.json"
COMPARISON_KIND = "strategy_comparison"
COMPARISON_SCHEMA_VERSION = 1
COMPARISON_FIELDS = (
    "schema_version",
    "kind",
    "time",
    "table",
    "verdict",
    "best",
    "code",
    "settings",
    "versions",
)


def comparison_path(log_dir: str | os.PathLike) -> Path:
    """``log_dir/strategy_comparison.json``, where ``compare_strategies`` writes its record.

    Args:
        log_dir: the comparison's log dir.

    Returns:
        The path (which may not exist).
    """
    return Path(log_dir) / COMPARISON_FILE


def _json_safe(value):
    """NaN and infinities become null (JSON has neither)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(key): _json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(item) for item in value]
    return value


def comparison_record(**fields) -> dict:
    """The record of a comparison, ready for JSON.

    Args:
        **fields: the fields of ``COMPARISON_FIELDS`` but the first two.

    Returns:
        The fields with ``schema_version`` and ``kind``, NaN and infinities as None.

    Raises:
        ValueError: a field that is not a comparison field (named, with those there are).

    Example:

    >>> from keras_dp_tools.records.comparison import comparison_record
    >>> record = comparison_record(settings={"steps": 20})
    >>> record["kind"], record["settings"]
    ('strategy_comparison', {'steps': 20})
    """
    unknown = set(fields) - set(COMPARISON_FIELDS[2:])
    if unknown:
        raise ValueError(
            f"Unknown comparison field(s) {sorted(unknown)}; expected {COMPARISON_FIELDS[2:]}."
        )
    record = {"schema_version": COMPARISON_SCHEMA_VERSION, "kind": COMPARISON_KIND, **fields}
    return _json_safe(record)


def write_comparison(log_dir: str | os.PathLike, record: dict) -> Path:
    """Writes a ``comparison_record`` atomically (a temporary file, then renamed).

    Args:
        log_dir: the comparison's log dir (created if missing).
        record: what ``comparison_record`` returned.

    Returns:
        The path written, ``log_dir/strategy_comparison.json``.

    Example:

    >>> import tempfile
    >>> from keras_dp_tools.records.comparison import (
    ...     comparison_record, read_comparison, write_comparison)
    >>> folder = tempfile.mkdtemp()
    >>> path = write_comparison(folder, comparison_record(settings={"steps": 20}))
    >>> read_comparison(folder)["settings"]
    {'steps': 20}
    """
    path = comparison_path(log_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(record, indent=1, allow_nan=False), "utf-8")
    os.replace(temporary, path)
    return path


def find_comparisons(log_dir: str | os.PathLike) -> list[Path]:
    """The folders that hold a ``strategy_comparison.json``.

    Args:
        log_dir: where to search (itself included, recursively, as the records are).

    Returns:
        The folders, sorted; [] when none do or ``log_dir`` is not a folder.
    """
    root = Path(log_dir)
    if not root.is_dir():
        return []
    return sorted(path.parent for path in root.glob(f"**/{COMPARISON_FILE}") if path.is_file())


def read_comparison(log_dir: str | os.PathLike) -> dict | None:
    """The comparison recorded in ``log_dir``.

    Args:
        log_dir: the comparison's log dir.

    Returns:
        The record (a dict), or None when there is none.

    Raises:
        ValueError: the file is not valid JSON or not a comparison record (the message
            names the file).
    """
    path = comparison_path(log_dir)
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text("utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON ({error}).") from None
    if not isinstance(record, dict) or record.get("kind") != COMPARISON_KIND:
        raise ValueError(
            f"{path} is not a strategy comparison record (no kind {COMPARISON_KIND!r})."
        )
    return record
