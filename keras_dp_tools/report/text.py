"""A report as plain text, for terminals and logs (``Report.text()``, ``keras-dp report``)."""

from __future__ import annotations

import pandas as pd

from keras_dp_tools.analysis import worker_digest
from keras_dp_tools.analysis.job_advice import job_findings
from keras_dp_tools.analysis.run_advice import advise_run
from keras_dp_tools.analysis.summary import run_summary, scaling_table
from keras_dp_tools.report.summary_fields import summary_table, summary_text


def report_text(frames) -> str:
    """The labelled summary (a column per run) and how to read it, the scaling table
    when the runs differ in replicas, the workers, and the advice (``Report.text()``).

    Args:
        frames: a ``RunFrames`` (``keras_dp_tools.analysis.run_frames``).

    Returns:
        The text, lines joined by newlines.
    """
    if frames.steps.empty:
        return no_steps_text(frames.runs)
    parts = job_text(job_findings(frames))
    summary = run_summary(frames, advice=False)
    runs = ", ".join(map(str, summary.index))
    parts.append(f"Summary of run {runs}:" if len(summary) == 1 else f"Summary of runs {runs}:")
    parts += summary_text(summary_table(summary))
    if frames.steps["replicas"].nunique() > 1:
        with pd.option_context("display.width", 160, "display.max_columns", 30):
            table = scaling_table(run_summary(frames, advice=False))
            parts += ["", "Scaling:", table.round(3).to_string(index=False)]
    parts += worker_text(frames.workers, frames.restarts)
    advice = advise_run(frames)
    parts += ["", "Advice:" if advice else "Advice: nothing stands out in the numbers."]
    parts += [str(finding) for finding in advice]
    return "\n".join(parts)


def job_text(findings) -> list[str]:
    """One line per finding about the log dir's jobs (``Report.job_findings()``), first:
    they say how to read the rest; their evidence and fix are in the advice."""
    if not findings:
        return []
    return ["Runs and workers:", *(f"- {finding.message}." for finding in findings), ""]


def no_steps_text(runs: pd.DataFrame) -> str:
    """Why there is nothing to summarise: no header yet, or no step yet."""
    if runs.empty:
        return (
            "No runs recorded yet: the records file(s) are empty. The job stopped (or "
            "is still starting) before keras_dp_tools wrote its run header."
        )
    names = ", ".join(runs["run"].drop_duplicates())
    return (
        f"Run {names} has no steps yet: the job stopped (or is still starting) before "
        f"its first training step finished ({len(runs)} worker header(s) recorded)."
    )


def worker_text(workers: pd.DataFrame, restarts: pd.DataFrame) -> list[str]:
    """Workers that stopped, restarts, and the straggler view, where there are any: a
    condition many workers share in one line, the worker table ranked, the top few of
    many (``analysis.worker_digest``)."""
    parts = []
    stopped = worker_digest.stopped_workers(workers)
    if stopped:
        parts += ["", "Workers that stopped before the end of fit:", *stopped]
    for line in worker_digest.restart_lines(restarts):
        parts += ["", line]
    shown, rest = worker_digest.ranked_workers(workers)
    if not shown.empty:
        parts += [
            "",
            "Workers (wait for the last worker to enter a step, on clocks aligned at "
            "the step ends; the one most often last first):",
            shown.round(3).to_string(index=False),
            *rest,
        ]
    return parts
