"""Runs summarised and compared: ``Report.summary()`` and ``Report.compare()`` as pure
functions over a run's frames (``analysis.run_frames.RunFrames``)."""

from __future__ import annotations

import pandas as pd

from keras_dp_tools.analysis.advice import advise
from keras_dp_tools.analysis.fit_time import fit_time_by_run
from keras_dp_tools.analysis.measured_steps import (
    multi_worker_runs,
    steps_per_worker,
    workers_per_run,
)
from keras_dp_tools.records import columns as schema


def run_summary(frames, advice: bool = True) -> pd.DataFrame:
    """One row per run (see ``Report.summary``).

    The step times (``median_step_ms``, ``p90_step_ms``, ``examples_per_s``,
    ``measured_steps``) are ``analysis.measured_steps.measured_step_times``: in a
    multi-worker run the job's step time, each step once; ``step_time_from`` names the
    column of ``Report.steps`` they come from (``job_step_ms`` or ``step_ms``; a
    multi-worker run where no two consecutive calls were recorded by every worker: the
    slowest worker's ``step_ms`` per step, ``measured_steps.SLOWEST_WORKER``, a lower
    bound). ``left_out_steps`` are the steps they leave out: those a profiler window or
    its trace's analysis disturbed, and in a multi-worker run the steps without a job
    step time.

    Args:
        frames: a ``RunFrames`` (``analysis.run_frames``).
        advice: add a column ``advice``: the titles of each run's findings.

    Returns:
        A DataFrame indexed by run, sorted by start.

    Example:

    ```python
    from keras_dp_tools.analysis.run_frames import load_run_frames
    from keras_dp_tools.analysis.summary import run_summary

    frames = load_run_frames([("runs/demo/keras_dp/worker-0.jsonl", 0)])
    print(run_summary(frames, advice=False)["median_step_ms"])
    ```
    """
    runs, parts = frames.runs, frames.step_parts
    steps = parts.all
    if steps.empty:
        return pd.DataFrame(columns=["start", "workers", "replicas", "steps"])
    multi_worker = multi_worker_runs(steps)
    measured = parts.measured()
    # A restart ran redone steps again: count them once. The summary reads the
    # breakdown on the rows that have one (parts.profiled), the rest on every step.
    # Of every step, the columns read below only: the rows are copied.
    steps = steps.loc[_counted(steps), [name for name in _STEP_INPUT if name in steps]]
    profiled = parts.profiled
    profiled = profiled[_counted(profiled)]
    grouped = steps.groupby("run", sort=False)
    timed = measured.groupby("run", sort=False)
    analysed = profiled[profiled["trace_step_ms"].notna()]
    runs_index = grouped.size().index

    # Each profiled step once, however many workers profiled it: their rows' mean.
    per_step = analysed.groupby(["run", "step"], sort=False)[list(schema.HEADLINE_COLUMNS)].mean()
    breakdown = per_step.groupby(level="run", sort=False).median()

    def count(frame):  # every worker records every step: count one worker's
        per_worker = steps_per_worker(frame)
        return per_worker.groupby("run").max().reindex(runs_index, fill_value=0)

    step_time_from = pd.Series("step_ms", index=grouped.size().index)
    step_time_from[step_time_from.index.isin(multi_worker)] = "job_step_ms"
    step_time_from.update(timed["step_time_from"].first())  # a run's fallback, if any

    counted = count(steps)
    measured_steps = timed["steps"].sum().reindex(runs_index, fill_value=0)
    summary = pd.DataFrame(
        {
            "workers": workers_per_run(steps).reindex(runs_index),
            "replicas": grouped["replicas"].first(),
            "global_batch": grouped["global_batch"].first(),
            "steps": counted,
            "measured_steps": measured_steps,
            "left_out_steps": counted - measured_steps,
            "breakdown_steps": count(analysed),
            "median_step_ms": timed["step_ms"].median(),
            "p90_step_ms": timed["step_ms"].quantile(0.9),
            "examples_per_s": timed["examples_per_s"].median(),
            "step_time_from": step_time_from,
            **{name: breakdown[name].reindex(runs_index) for name in schema.HEADLINE_COLUMNS},
            "gpu_util": grouped["gpu_util_mean"].mean(),
        }
    )
    fit_time = fit_time_by_run(frames.fits).reindex(summary.index)
    summary["fit_s"] = fit_time["fit_s"]
    summary["outside_steps_share"] = fit_time["outside_steps_share"]
    started = runs.groupby("run")["time"].min()
    summary.insert(0, "start", pd.to_datetime(started.reindex(summary.index), unit="s"))
    # The copy of every step's columns goes before the advice builds the worker view
    # (most of the summary's memory at cluster scale).
    del steps, grouped, profiled, analysed
    if advice:
        summary["advice"] = [
            "; ".join(item.title for item in advise(frames.for_run(run))) for run in summary.index
        ]
    return summary.sort_values("start")


# What the summary reads of every (counted) step; the breakdown it reads of the profiled.
_STEP_INPUT = ["run", "worker", "replicas", "global_batch", "steps", "gpu_util_mean"]


def _counted(steps: pd.DataFrame) -> pd.Series:
    """The steps that count: not warm-up, not redone (a restart ran them again)."""
    return ~steps["warmup"].fillna(False).astype(bool) & ~steps["redone"].astype(bool)


def scaling_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Runs side by side by replica count (see ``Report.compare``): throughput, speed-up
    and scaling efficiency.

    Args:
        summary: ``run_summary``'s frame.

    Returns:
        A DataFrame, one row per replica count (the latest run of each), by replicas.
    """
    summary = summary.dropna(subset=["replicas"]).drop_duplicates("replicas", keep="last")
    summary = summary.sort_values("replicas")
    throughput = summary["examples_per_s"].where(
        summary["examples_per_s"].notna(), 1000.0 / summary["median_step_ms"]
    )
    base = summary.iloc[0] if len(summary) else None
    table = pd.DataFrame(
        {
            "run": summary.index,
            "replicas": summary["replicas"].astype("int64").to_numpy(),
            "global_batch": summary["global_batch"].to_numpy(),
            "median_step_ms": summary["median_step_ms"].to_numpy(),
            "throughput": throughput.to_numpy(),
            "comm_share": summary["comm_share"].to_numpy(),
            "wait_share": summary["wait_share"].to_numpy(),
        }
    )
    if base is not None:
        base_throughput = table["throughput"].iloc[0]
        table["speedup"] = table["throughput"] / base_throughput
        ideal = table["replicas"] / int(base["replicas"])
        table["scaling_efficiency"] = table["speedup"] / ideal
    return table.reset_index(drop=True)
