"""REPORT.md from the steps' results: the machine, then per step its status, time,
and each compared number against its tolerance (PASS / FAIL). Rewritten after every
step, so a killed run leaves a report of what it got to."""

from __future__ import annotations

import time
from pathlib import Path

from dev.gpu_check.results import verdict

REPORT_FILE = "REPORT.md"
_LOG_TAIL_LINES = 25


def step_status(result: dict) -> str:
    """The step's status; an ``ok`` step with a tolerance exceeded is a FAIL."""
    status = str(result.get("status", "pending")).upper()
    failed = [row for row in result.get("findings", []) if verdict(row)[0] == "FAIL"]
    if status == "OK" and failed:
        return f"FAIL ({len(failed)} of {len(result['findings'])} checks)"
    return status


def _number(value, relative: bool = False) -> str:
    if value is None:
        return "n/a"
    if relative:
        return f"{value * 100:.1f}%"
    return f"{value:.4g}"


def findings_table(findings: list[dict]) -> list[str]:
    lines = [
        "| check | ours | reference | difference | tolerance | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for row in findings:
        outcome, difference = verdict(row)
        unit = f" {row['unit']}" if row.get("unit") else ""
        relative = bool(row.get("relative"))
        lines.append(
            f"| {row['check']} | {_number(row.get('ours'))}{unit} | "
            f"{_number(row.get('reference'))}{unit} | {_number(difference, relative)} | "
            f"{_number(row['tolerance'], relative)}{'' if relative else unit} | {outcome} |"
        )
    return lines


def _log_tail(out: Path, result: dict) -> list[str]:
    try:
        text = (out / result["step"] / "log.txt").read_text(errors="replace")
    except (OSError, KeyError):
        return []
    lines = text.rstrip().splitlines()
    shown = lines if result.get("show_log") else lines[-_LOG_TAIL_LINES:]
    if not shown:
        return []
    heading = "Output:" if result.get("show_log") else f"Last {len(shown)} lines of log.txt:"
    return ["", heading, "", "```", *shown, "```"]


def render(
    out: Path, results: list[dict], pending: list[str], machine: dict[str, str], state: str
) -> str:
    lines = ["# GPU check report", ""]
    lines.append(f"- date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
    lines.extend(f"- {name}: {value}" for name, value in machine.items())
    lines += [f"- state: {state}", "", "| step | status | seconds | summary |", "|---|---|---|---|"]
    for result in results:
        summary = str(result.get("summary", "")).replace("|", "/").replace("\n", " ")
        seconds = result.get("seconds", "")
        lines.append(f"| {result['step']} | {step_status(result)} | {seconds} | {summary} |")
    lines.extend(f"| {name} | PENDING | | not run (yet) |" for name in pending)
    for result in results:
        lines += ["", f"## {result['step']}: {result.get('title', '')}", ""]
        lines.append(f"Status: **{step_status(result)}**. {result.get('summary', '')}")
        if result.get("command"):
            lines += ["", f"Command: `{result['command']}`"]
        if result.get("findings"):
            lines += ["", *findings_table(result["findings"])]
        if result.get("notes"):
            lines += ["", *(f"- {note}" for note in result["notes"])]
        if result.get("show_log") or step_status(result) not in ("OK", "DRY-RUN", "SKIPPED"):
            lines += _log_tail(out, result)
    return "\n".join(lines) + "\n"


def write_report(
    out: Path, results: list[dict], pending: list[str], machine: dict[str, str], state: str
) -> Path:
    """Writes ``out/REPORT.md`` (atomically: a kill mid-write leaves the previous one)."""
    path = out / REPORT_FILE
    partial = path.with_suffix(".md.partial")
    partial.write_text(render(out, results, pending, machine, state))
    partial.replace(path)
    return path
