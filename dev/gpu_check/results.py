"""What a step writes: ``<out>/<step>/result.json``, read by the report writer; and
the command-line options every step takes to write it (``step_parser``).

Shape (the fixtures under tests/fixtures/gpu_check/ are examples)::

    {"step": "fit_1gpu", "status": "ok" | "failed" | "skipped" | "dry-run",
     "summary": "one line", "notes": ["..."],
     "findings": [{"check": "...", "ours": 1.0, "reference": 1.0, "tolerance": 0.1,
                   "relative": true, "unit": "ms"}]}

The runner adds ``seconds``, ``returncode`` and, for a step killed at its timeout or
one that wrote nothing, ``status`` ``timeout`` / ``crashed``.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

RESULT_FILE = "result.json"


def step_parser(doc: str) -> argparse.ArgumentParser:
    """A step's command line: ``--out`` (the folder its result.json goes to) and
    ``--dry-run`` (print the plan, write a ``dry-run`` result) that every step takes."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dry-run", action="store_true")
    return parser


def finding(check, ours, reference, tolerance, *, relative=False, unit="") -> dict:
    """One compared number: ``ours`` passes when within ``tolerance`` of ``reference``
    (a fraction of it when ``relative``)."""
    return {
        "check": check,
        "ours": _number(ours),
        "reference": _number(reference),
        "tolerance": tolerance,
        "relative": relative,
        "unit": unit,
    }


def _number(value):
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def verdict(row: dict) -> tuple[str, float | None]:
    """``PASS`` / ``FAIL`` and the difference, or ``n/a`` when a number is missing."""
    ours, reference = row.get("ours"), row.get("reference")
    if ours is None or reference is None:
        return "n/a", None
    difference = abs(ours - reference)
    if row.get("relative"):
        if reference == 0:
            return ("PASS" if difference == 0 else "FAIL"), None
        difference /= abs(reference)
    return ("PASS" if difference <= row["tolerance"] else "FAIL"), difference


def write_result(directory: Path, result: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / RESULT_FILE
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return path


def read_result(directory: Path) -> dict | None:
    try:
        return json.loads((directory / RESULT_FILE).read_text())
    except (OSError, ValueError):
        return None
