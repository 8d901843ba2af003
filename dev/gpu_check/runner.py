"""Runs the steps one after another, each a subprocess in its own process group with
its own timeout, so one hang costs only its own time and the next step still runs."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from dev.gpu_check.results import read_result, write_result
from dev.gpu_check.steps import Step

LOG_FILE = "log.txt"
REPO = Path(__file__).resolve().parents[2]
_KILL_GRACE_S = 5.0


def step_environment(step: Step) -> dict[str, str]:
    """Ours first on the path, so every step imports this copy of the package."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.update(step.env)
    return env


def _stop(process: subprocess.Popen) -> None:
    """TERM, then KILL, the step's whole process group (its own children too). The KILL
    goes to the group even when the step itself ended on TERM: a child that ignores TERM
    (TensorFlow, pytest) must not outlive its step."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=_KILL_GRACE_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def run_step(step: Step, out: Path, timeout_s: float, python: str, dry: bool = False) -> dict:
    """Runs one step (its dry form when ``dry``) and returns its result, also written to
    ``out/<step>/result.json``."""
    directory = out / step.name
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "result.json").unlink(missing_ok=True)  # a stale one must not pass
    argv = step.command(python, directory, dry)
    settings = [f"{name}={value}" for name, value in step.env.items()]
    shown = shlex.join([*settings, *(step.command(python, directory) or [])])
    if argv is None:
        result = {"status": "dry-run", "summary": "no CPU-dry form: the command is printed only"}
        return _finish(step, directory, result, shown, 0.0, None)
    started = time.monotonic()
    with open(directory / LOG_FILE, "wb") as log:
        process = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=REPO,
            env=step_environment(step),
            start_new_session=True,
        )
        try:
            returncode = process.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            _stop(process)
            returncode, timed_out = process.returncode, True
    seconds = time.monotonic() - started
    result = (read_result(directory) if step.writes_result else None) or {}
    if timed_out:
        result["status"] = "timeout"
        result["summary"] = f"killed after {timeout_s:.0f} s (its timeout); see {LOG_FILE}"
    elif not result:
        if step.writes_result:
            result = {"status": "crashed", "summary": f"exit {returncode}, no result.json"}
        else:
            ok = returncode == 0
            result = {
                "status": ("dry-run" if dry else "ok") if ok else "failed",
                "summary": f"exit status {returncode}: {_last_line(directory / LOG_FILE)}",
            }
    elif returncode != 0 and result.get("status") in ("ok", "dry-run"):
        result["status"] = "failed"
        result["summary"] = f"exit status {returncode} after: {result.get('summary', '')}"
    if dry:
        result["dry_command"] = shlex.join([*settings, *argv])
    return _finish(step, directory, result, shown, seconds, returncode)


def _last_line(path: Path) -> str:
    """The log's last line (pytest's totals, doctor's check line)."""
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1].strip() if lines else ""


def _finish(step, directory, result, command, seconds, returncode) -> dict:
    result.update(
        step=step.name,
        title=step.title,
        command=command,
        seconds=round(seconds, 1),
        returncode=returncode,
        show_log=step.show_log,
    )
    result.setdefault("findings", [])
    result.setdefault("notes", [])
    write_result(directory, result)
    return result


def skipped(step: Step, out: Path, why: str) -> dict:
    directory = out / step.name
    directory.mkdir(parents=True, exist_ok=True)
    return _finish(step, directory, {"status": "skipped", "summary": why}, "", 0.0, None)


def run_all(
    steps: list[Step],
    out: Path,
    budget_s: float,
    python: str,
    dry: bool = False,
    after_each: Callable[[list[dict]], None] = lambda results: None,
) -> list[dict]:
    """Every step in order within ``budget_s``: a step's timeout is cut to what is left,
    and under 10 s left it is skipped (``rest_of_budget`` steps take whatever is left,
    if at least their ``timeout_s``). ``after_each`` gets the results so far."""
    deadline = time.monotonic() + budget_s
    results: list[dict] = []
    tensorflow_missing = None
    for step in steps:
        left = deadline - time.monotonic()
        if step.needs_tensorflow and tensorflow_missing and not dry:
            result = skipped(step, out, f"TensorFlow is not installed: {tensorflow_missing}")
        elif left < min(step.timeout_s, 10.0) or (step.rest_of_budget and left < step.timeout_s):
            result = skipped(
                step, out, f"budget spent ({max(left, 0):.0f} s left of {budget_s:.0f})"
            )
        else:
            timeout = left if step.rest_of_budget else min(step.timeout_s, left)
            result = run_step(step, out, timeout, python, dry)
        if result.get("tensorflow") is False:
            tensorflow_missing = result.get("summary", "the install step could not")
        results.append(result)
        after_each(results)
    return results
