"""Lines that plots of a multi-worker run share (``report.plots``): the job's step
times beside each worker's own, and a legend that gives way to a count at many workers.
"""

from __future__ import annotations

import pandas as pd

# Most entries a legend lists; beyond, a line under the axes says what the lines are.
MAX_LEGEND = 16


def legend_or_count(axes, entries: int, what: str) -> None:
    """The legend right of the axes, or, with more than ``MAX_LEGEND`` entries (a
    legend of many workers fills the figure), a note of how many there are.

    Args:
        axes: matplotlib axes with labelled lines.
        entries: how many labelled lines they hold.
        what: what the lines are, for the note (``"workers"``).
    """
    if entries <= MAX_LEGEND:
        axes.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
        return
    axes.set_xlabel(f"{axes.get_xlabel()}\n{entries} {what} (too many to list)")


# Workers of a run whose own step times step_time draws one line each; more: a band.
OWN_LINES_UP_TO = 4


def job_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """A multi-worker run's step times of the job.

    Args:
        steps: one run's rows of ``Report.steps``.

    Returns:
        One row per step with a ``job_step_ms``, sorted, its ``warmup`` and
        ``profiled`` flags as booleans; empty without the column.

    Example:

    >>> import pandas as pd
    >>> from keras_dp_tools.report.step_lines import job_steps
    >>> steps = pd.DataFrame({"step": [2, 1, 2], "worker": [0, 0, 1],
    ...                       "job_step_ms": [11.0, None, 11.0],
    ...                       "warmup": [False, True, False], "profiled": [None, None, None]})
    >>> job_steps(steps)[["step", "job_step_ms", "profiled"]].values.tolist()
    [[2, 11.0, False]]
    """
    if "job_step_ms" not in steps:
        return steps.iloc[:0]
    job = steps.dropna(subset=["job_step_ms"]).drop_duplicates("step").sort_values("step")
    flags = {name: job[name].fillna(False).astype(bool) for name in ("warmup", "profiled")}
    return job.assign(**flags)


def draw_own_step_times(axes, steps: pd.DataFrame) -> None:
    """Each worker's own time in the train call (``step_ms``), thin and pale under the
    job's line: a line per worker for a few, else the band from the shortest to the
    longest of them per step.

    Args:
        axes: the matplotlib axes of the step-time plot.
        steps: one run's rows of ``Report.steps`` (``worker``, ``step``, ``step_ms``).
    """
    if steps["worker"].nunique() <= OWN_LINES_UP_TO:
        for worker, rows in steps.groupby("worker"):
            label = f"worker {worker} (its own time in the train call)"
            axes.plot(rows["step"], rows["step_ms"], label=label, linewidth=0.7, alpha=0.7)
        return
    spread = steps.groupby("step")["step_ms"].agg(["min", "max"])
    axes.fill_between(
        spread.index,
        spread["min"],
        spread["max"],
        color="C0",
        alpha=0.3,
        linewidth=0,
        label="workers' own time in the train call (shortest to longest)",
    )
