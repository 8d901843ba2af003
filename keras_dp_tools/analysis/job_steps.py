"""One profiler window of a multi-worker job, merged: every worker's step rows of a step
become the job's view of that step.

Each worker analyses its own trace (``Breakdown.steps``: its replicas' times averaged).
In synchronous data parallelism a step ends for all workers when the slowest worker's
gradients are in: the job's step is the longest, and the slowest worker is the one with
the most work of its own (compute and input) -- the others spend the difference waiting
in the all-reduce, which one worker's trace cannot tell from the transfer itself.
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
            ``step_ms`` (the longest worker's: the job's step); ``slowest_worker``
            (the most ``own_ms``; -1: no worker measured the step) and its ``own_ms``,
            ``compute_ms``, ``transfer_ms``, ``sync_wait_ms``, ``input_ms``;
            ``spread_ms`` (its ``own_ms`` - the least of any worker) and
            ``max_sync_wait_ms`` over workers.
        workers: one row per step and worker: ``step``, ``worker``, the worker's
            ``WORKER_COLUMNS``, ``own_ms`` (compute + input: its own work),
            ``behind_ms`` (the slowest worker's ``own_ms`` - its own: about how long it
            waited for the slowest) and ``slowest`` (bool).
    """

    steps: pd.DataFrame
    workers: pd.DataFrame


def merge_worker_steps(steps_by_worker: Mapping[int, pd.DataFrame]) -> JobSteps:
    """Merges each worker's step rows (``Breakdown.steps`` of its trace of one window)
    into the job's view of every step (``JobSteps``). A step missing from a worker's
    rows counts only the workers that have it; a worker's row without measured times
    (an untrue marker) is kept but is never the slowest. Of workers with equal
    ``own_ms``, the lowest index is the slowest.

    Args:
        steps_by_worker: by worker index, its ``Breakdown.steps`` frame (at least
            ``step`` and ``step_ms``; the other ``WORKER_COLUMNS`` are NaN if absent).

    Returns:
        ``JobSteps``, steps in ascending order, workers ascending within a step.

    Example:
        >>> import pandas as pd
        >>> from keras_dp_tools.analysis.job_steps import merge_worker_steps
        >>> job = merge_worker_steps({
        ...     0: pd.DataFrame({"step": [5], "step_ms": [100.0], "compute_ms": [60.0]}),
        ...     1: pd.DataFrame({"step": [5], "step_ms": [101.0], "compute_ms": [90.0]}),
        ... })
        >>> row = job.steps.iloc[0]
        >>> int(row["workers"]), float(row["step_ms"]), int(row["slowest_worker"])
        (2, 101.0, 1)
        >>> job.workers["behind_ms"].tolist()
        [30.0, 0.0]
    """
    parts = []
    for worker, steps in steps_by_worker.items():
        part = pd.DataFrame({"step": steps["step"].astype("int64"), "worker": int(worker)})
        for name in WORKER_COLUMNS:
            part[name] = steps[name].astype(float).to_numpy() if name in steps else np.nan
        parts.append(part)
    columns = ["step", "worker", *WORKER_COLUMNS]
    workers = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=columns)
    workers = workers.astype({"step": "int64", "worker": "int64"})
    workers = workers.sort_values(["step", "worker"], kind="stable", ignore_index=True)
    own = workers[["compute_ms", "input_ms"]].sum(axis=1, min_count=1)
    workers["own_ms"] = own.where(workers["step_ms"].notna())
    grouped = workers.groupby("step", sort=True)
    most = grouped["own_ms"].transform("max")
    workers["behind_ms"] = most - workers["own_ms"]
    slowest = workers["own_ms"].eq(most)  # NaN never equals
    slowest &= slowest.groupby(workers["step"]).cumsum().eq(1)  # the first of a tie
    workers["slowest"] = slowest
    steps = pd.DataFrame(
        {"workers": grouped["worker"].nunique(), "step_ms": grouped["step_ms"].max()}
    )
    chosen = workers[slowest].set_index("step")
    steps["slowest_worker"] = chosen["worker"].reindex(steps.index).fillna(-1).astype("int64")
    for name in ("own_ms", "compute_ms", "transfer_ms", "sync_wait_ms", "input_ms"):
        steps[name] = chosen[name].reindex(steps.index)
    steps["spread_ms"] = steps["own_ms"] - grouped["own_ms"].min()
    steps["max_sync_wait_ms"] = grouped["sync_wait_ms"].max()
    return JobSteps(steps.reset_index(), workers)
