"""The workers of a job in a few lines, at 2 workers or 64: a condition every worker
shares is one line ("64 workers stopped after step 199 (no end of fit recorded ...)"),
and the worker table is ranked, the worker that holds the job back first, with the few
at the top shown and the rest summed up as "N more workers alike" with their ranges.

Pure functions over ``Report.workers`` and ``Report.restarts`` (``analysis.workers``);
the text report prints them. ``Report.workers`` keeps every row.
"""

from __future__ import annotations

import pandas as pd

TOP_WORKERS = 5  # rows of the worker table shown per run of many workers
ALL_WORKERS_UP_TO = 8  # a run of this many workers or fewer shows every row
LISTED_UP_TO = 3  # workers that share a condition, each on a line of its own
LATE_WORKER_SHARE = 0.6  # one worker last to enter this share of the timed steps

# The straggler view's columns of Report.workers, in the order shown; the ranking reads
# the first ones: who entered last most often, then who spent longest between calls.
WORKER_TABLE_COLUMNS = [
    "run",
    "worker",
    "median_worker_wait_ms",
    "last_to_enter_share",
    "median_host_gap_ms",
    "clock_offset_ms",
    "clock_residual_ms",
]
_RANGE_COLUMNS = ["median_worker_wait_ms", "last_to_enter_share", "median_host_gap_ms"]


def worker_names(indexes) -> str:
    """``worker 3``; ``workers 0-4, 6 and 9``: runs of consecutive indexes as ranges."""
    indexes = sorted({int(index) for index in indexes})
    if len(indexes) == 1:
        return f"worker {indexes[0]}"
    spans: list[list[int]] = []
    for index in indexes:
        if spans and index == spans[-1][1] + 1:
            spans[-1][1] = index
        else:
            spans.append([index, index])
    parts = []
    for first, last in spans:  # a pair of neighbours reads better as two names
        parts += (
            [f"{first}-{last}"]
            if last > first + 1
            else list(map(str, dict.fromkeys((first, last))))
        )
    if len(parts) == 1:
        return f"workers {parts[0]}"
    return "workers " + ", ".join(parts[:-1]) + f" and {parts[-1]}"


def stopped_workers(view: pd.DataFrame) -> list[str]:
    """Sentences naming the workers of a multi-worker run that did not finish their fit
    (``Report.workers``): one per worker, or, for more than ``LISTED_UP_TO`` workers
    that stopped the same way, one for them all.

    Args:
        view: ``Report.workers`` (``analysis.workers.worker_view``).

    Returns:
        The sentences, e.g. ``run r: 64 workers stopped after step 199 (no end of fit
        recorded: killed, or still running)``.

    Example:

    ```python
    for line in stopped_workers(kdt.Report.load("runs/job").workers):
        print(line)
    ```
    """
    lines = []
    for run, group in view.groupby("run", sort=False):
        latest = group.drop_duplicates("worker", keep="last")
        if len(latest) < 2 and latest["ended"].eq("finished").all():
            continue
        stopped = latest[latest["ended"] != "finished"]
        hows = [_how(row) for row in stopped.itertuples()]
        for how, alike in stopped.groupby(pd.Series(hows, index=stopped.index), sort=False):
            if len(alike) <= LISTED_UP_TO:
                lines += [
                    f"run {run}: worker {row.worker} stopped {_at(row.last_step)} ({how})"
                    for row in alike.itertuples()
                ]
                continue
            last = alike["last_step"]
            if last.nunique() == 1 and last.notna().all():
                at = _at(last.iloc[0])
            elif last.notna().all():
                at = f"after steps {int(last.min())} to {int(last.max())}"
            else:
                at = "at various points"
            everyone = len(alike) == len(latest)
            who = f"all {len(alike)} workers" if everyone else _counted(alike["worker"])
            lines.append(f"run {run}: {who} stopped {at} ({how})")
    return lines


def _how(row) -> str:
    if isinstance(row.exit, str):
        return row.exit
    if row.ended == "exited":
        return "its process left the fit (an exception)"
    return "no end of fit recorded: killed, or still running"


def _at(last_step) -> str:
    return f"after step {int(last_step)}" if pd.notna(last_step) else "before step 0"


def _counted(workers) -> str:
    return f"{len(workers)} workers ({worker_names(workers).removeprefix('workers ')})"


def restart_lines(restarts: pd.DataFrame) -> list[str]:
    """One sentence per restart (``Report.restarts``); the workers of a run that
    restarted alike (a job restarted whole: same attempt, same resumed and previous
    step) in one.

    Example:

    ```python
    print("\\n".join(restart_lines(kdt.Report.load("runs/job").restarts)))
    ```
    """
    keys = ["run", "attempt", "resumed_at_step", "previous_last_step", "redone_steps"]
    lines = []
    if restarts.empty:
        return lines
    for key, group in restarts.groupby(keys, sort=False, dropna=False):
        run, attempt, resumed, previous, redone = key
        lines.append(
            f"Restart: run {run} {worker_names(group['worker'])} attempt {attempt} resumed "
            f"at step {resumed} (the previous attempt recorded up to step {previous}; "
            f"{redone} step(s) ran again)."
        )
    return lines


def ranked_workers(view: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The worker table (``WORKER_TABLE_COLUMNS``) of the workers with a cross-worker
    wait, ranked per run: most often last to enter first, then the longest between
    train calls, then the least waiting; of a run of more than ``ALL_WORKERS_UP_TO``
    workers the top ``TOP_WORKERS`` rows and a line for the rest, with their ranges.

    Args:
        view: ``Report.workers``.

    Returns:
        The rows shown, and one line per run with rows left out (``59 more workers of
        run r alike: median_worker_wait_ms 2.96 to 3.02, ...``).

    Example:

    ```python
    shown, rest = ranked_workers(kdt.Report.load("runs/job").workers)
    print(shown.to_string(index=False), *rest, sep="\\n")
    ```
    """
    timed = view.dropna(subset=["median_worker_wait_ms"])[WORKER_TABLE_COLUMNS]
    ranked = timed.sort_values(
        ["last_to_enter_share", "median_host_gap_ms", "median_worker_wait_ms", "worker"],
        ascending=[False, False, True, True],
        na_position="last",
        kind="stable",
    )
    shown, rest = [], []
    for run, group in ranked.groupby("run", sort=False):
        if group["worker"].nunique() <= ALL_WORKERS_UP_TO:
            shown.append(group)
            continue
        shown.append(group.iloc[:TOP_WORKERS])
        left = group.iloc[TOP_WORKERS:]
        ranges = ", ".join(
            f"{name} {left[name].min():.3g} to {left[name].max():.3g}"
            for name in _RANGE_COLUMNS
            if left[name].notna().any()
        )
        rest.append(
            f"... {len(left)} more workers of run {run} alike ({ranges}); "
            "Report.workers has every row."
        )
    table = pd.concat(shown) if shown else timed
    return table, rest


def shortest_own_steps(steps: pd.DataFrame, run, worker: int) -> bool:
    """Whether the worker's median own step time (``step_ms``, inside its train call)
    is the lowest of its run's workers, over the steps with a cross-worker wait: what a
    worker that enters each step last shows, as it waits least inside the step.

    Example:

    ```python
    report = kdt.Report.load("runs/job")
    print(shortest_own_steps(report.steps, report.runs["run"].iloc[0], 1))
    ```
    """
    columns = steps[["run", "worker", "worker_wait_ms", "step_ms"]]  # not every column
    timed = columns[(columns["run"] == run) & columns["worker_wait_ms"].notna()]
    own = timed.groupby("worker")["step_ms"].median()
    return len(own) > 1 and worker in own.index and own.idxmin() == worker


def late_worker(view: pd.DataFrame, run, share: float = LATE_WORKER_SHARE) -> int | None:
    """The worker of ``run`` that entered at least ``share`` of the steps last
    (``Report.workers``' ``last_to_enter_share``, its latest attempt) while the others
    waited for it (their median wait above 3 times the clocks' residual), or None.

    Example:

    ```python
    report = kdt.Report.load("runs/job")
    print(late_worker(report.workers, report.runs["run"].iloc[0]))
    ```
    """
    mine = view[view["run"] == run].dropna(subset=["last_to_enter_share"])
    mine = mine.drop_duplicates("worker", keep="last")
    if mine["worker"].nunique() < 2:
        return None
    top = mine.loc[mine["last_to_enter_share"].idxmax()]
    others = mine[mine["worker"] != top["worker"]]
    waited = others["median_worker_wait_ms"].median()
    residual = mine["clock_residual_ms"].max()
    clear = waited > 0 and not waited <= 3 * residual  # NaN residual: no bound
    return int(top["worker"]) if top["last_to_enter_share"] >= share and clear else None
