"""One profiler window of a multi-worker job, merged: every worker's step rows of a step
become the job's view of that step.

Each worker analyses its own trace (``Breakdown.steps``: its replicas' times averaged).
In synchronous data parallelism a step ends for all workers when the slowest worker's
gradients are in, so the job's step is the slowest worker's; the others spend the
difference waiting in the all-reduce (their ``sync_wait_ms``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

# The per-worker numbers kept beside each other (columns of ``Breakdown.steps``).
WORKER_COLUMNS = (
    "step_ms",
    "compute_ms",
    "transfer_ms",
    "sync_wait_ms",
    "allreduce_ms",
    "input_ms",
)


@dataclass
class JobSteps:
    """The job's view of a window's steps.

    Attributes:
        steps: one row per step: ``step``; ``workers`` (how many profiled it);
            ``step_ms`` (the slowest worker's: the job's step), ``slowest_worker``
            (-1: no worker measured the step), ``fastest_step_ms``, ``median_step_ms``,
            ``spread_ms`` (slowest - fastest); the slowest worker's ``compute_ms``,
            ``transfer_ms``, ``sync_wait_ms``, ``input_ms``; and ``max_sync_wait_ms``
            over workers.
        workers: one row per step and worker: ``step``, ``worker``, the worker's
            ``WORKER_COLUMNS``, ``behind_ms`` (how much shorter its step was than the
            job's: time it waited for the slowest) and ``slowest`` (bool).
    """

    steps: pd.DataFrame
    workers: pd.DataFrame


def merge_worker_steps(steps_by_worker: Mapping[int, pd.DataFrame]) -> JobSteps:
    """Merges each worker's step rows (``Breakdown.steps`` of its trace of one window)
    into the job's view of every step (``JobSteps``). A step missing from a worker's
    rows counts only the workers that have it; a worker's row without a measured
    ``step_ms`` (an untrue marker) is kept but is never the slowest.

    Args:
        steps_by_worker: by worker index, its ``Breakdown.steps`` frame (at least
            ``step`` and ``step_ms``; the other ``WORKER_COLUMNS`` are NaN if absent).

    Returns:
        ``JobSteps``, steps in ascending order, workers ascending within a step.

    Example:
        >>> import pandas as pd
        >>> from keras_dp_tools.analysis.job_steps import merge_worker_steps
        >>> job = merge_worker_steps({
        ...     0: pd.DataFrame({"step": [5], "step_ms": [100.0], "sync_wait_ms": [30.0]}),
        ...     1: pd.DataFrame({"step": [5], "step_ms": [130.0], "sync_wait_ms": [0.0]}),
        ... })
        >>> row = job.steps.iloc[0]
        >>> int(row["workers"]), float(row["step_ms"]), int(row["slowest_worker"])
        (2, 130.0, 1)
    """
    parts = []
    for worker, steps in steps_by_worker.items():
        part = pd.DataFrame({"step": steps["step"].astype("int64"), "worker": int(worker)})
        for name in WORKER_COLUMNS:
            part[name] = steps[name].astype(float) if name in steps else np.nan
        parts.append(part)
    columns = ["step", "worker", *WORKER_COLUMNS]
    workers = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=columns)
    workers = workers.sort_values(["step", "worker"], kind="stable", ignore_index=True)
    grouped = workers.groupby("step", sort=True)
    job_ms = grouped["step_ms"].transform("max")
    workers["behind_ms"] = job_ms - workers["step_ms"]
    # The slowest: the first worker (lowest index) whose step is the job's.
    slowest = workers["step_ms"].eq(job_ms) & workers["step_ms"].notna()
    slowest &= ~slowest.groupby(workers["step"]).cumsum().gt(1)
    workers["slowest"] = slowest
    steps = pd.DataFrame(
        {
            "workers": grouped["worker"].nunique(),
            "step_ms": grouped["step_ms"].max(),
            "fastest_step_ms": grouped["step_ms"].min(),
            "median_step_ms": grouped["step_ms"].median(),
        }
    )
    steps["spread_ms"] = steps["step_ms"] - steps["fastest_step_ms"]
    chosen = workers[slowest].set_index("step")
    steps["slowest_worker"] = chosen["worker"].reindex(steps.index).fillna(-1).astype("int64")
    for name in ("compute_ms", "transfer_ms", "sync_wait_ms", "input_ms"):
        steps[name] = chosen[name].reindex(steps.index)
    steps["max_sync_wait_ms"] = grouped["sync_wait_ms"].max()
    steps = steps.reset_index()
    order = ["step", "workers", "step_ms", "slowest_worker", "fastest_step_ms"]
    order += ["median_step_ms", "spread_ms", "compute_ms", "transfer_ms", "sync_wait_ms"]
    order += ["input_ms", "max_sync_wait_ms"]
    return JobSteps(steps[order], workers)
