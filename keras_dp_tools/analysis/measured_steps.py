"""Measured step times: the step times a run's statistics read (the summary's median
and p90, the advisor's jitter and straggler cost): a single worker's own ``step_ms``,
a multi-worker job's ``job_step_ms`` (each step once), steps a profiler disturbed left
out.

A worker's ``step_ms`` is its own time inside the train call: a worker slow *between*
calls shows a short one, the workers waiting for it a long one; the job advances once
per step of its slowest worker (``analysis.clocks.job_step_times``).

Pure functions over the steps frame; no TensorFlow.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from keras_dp_tools.analysis.step_keys import run_codes, sorted_blocks, warmup_mask, with_run_ids

# measured_step_times: the steps behind a run's step-time statistics.
MEASURED_STEP_COLUMNS = ["run", "step", "steps", "step_ms", "examples_per_s", "step_time_from"]


# A multi-worker run without the job's step time (no two consecutive calls recorded by
# every worker: one call per epoch, a very short fit): the slowest worker's time inside
# each call, a lower bound of the job's step (it leaves out the host work between calls).
SLOWEST_WORKER = "step_ms (slowest worker: a lower bound)"


def workers_per_run(steps: pd.DataFrame) -> pd.Series:
    """How many workers each run of the steps has (``nunique``), by run in the order
    they first appear."""
    runs = steps["run"]
    if len(runs) and runs.notna().all() and (runs == runs.iloc[0]).all():  # one run
        return pd.Series([steps["worker"].nunique()], index=pd.Index([runs.iloc[0]], name="run"))
    # The distinct run and worker pairs first: a grouped nunique sorted every step.
    pairs = steps[["run", "worker"]].drop_duplicates()
    return pairs.groupby("run", sort=False)["worker"].nunique()


def steps_per_worker(steps: pd.DataFrame) -> pd.Series:
    """The steps each run's worker recorded (``steps``, 1 where empty), summed: by run
    and worker. Sorted steps are summed in their blocks (not grouped on the run id)."""
    counts = steps["steps"].fillna(1)
    blocks = sorted_blocks(steps, ["run", "worker"])
    if blocks is None or not isinstance(counts.dtype, np.dtype) or counts.dtype.kind not in "iuf":
        return counts.groupby([steps["run"], steps["worker"]]).sum()
    starts, _ = blocks
    first = steps.iloc[starts]
    index = pd.MultiIndex.from_arrays([first["run"], first["worker"]], names=["run", "worker"])
    return pd.Series(np.add.reduceat(counts.to_numpy(), starts), index=index, name="steps")


def multi_worker_runs(steps: pd.DataFrame) -> pd.Index:
    """The runs of ``Report.steps`` with timed step records (``step_ms``, StepTimer's)
    of two workers or more."""
    workers = workers_per_run(steps[steps["step_ms"].notna()])
    return workers.index[workers >= 2]


# What measured_step_times reads of the steps.
_MEASURED_INPUT = [*MEASURED_STEP_COLUMNS[:-1], "worker", "profiled", "job_step_ms", "global_batch"]
_MEASURED_INPUT += ["warmup", "redone"]


_BY_STEP_INPUT = ["run", "step", "steps", "job_step_ms", "step_ms", "global_batch", "profiled"]


def measured_step_times(steps: pd.DataFrame, disturbed: bool = False) -> pd.DataFrame:
    """The step times a run's statistics read: ``Report.summary()``'s
    ``median_step_ms``, ``p90_step_ms`` and ``examples_per_s``, and the advisor's
    "Step times vary a lot" and the straggling worker's share of the step.

    A single-worker run: each step record's ``step_ms`` and ``examples_per_s`` (its
    time inside the train call). A multi-worker run: each step once, at the job's pace
    (``job_step_ms``, and the step's ``examples``, else ``global_batch``, over it); a
    worker's own ``step_ms`` there is short on the worker the others wait for, and long
    on the others. A multi-worker run
    without any job step time (no two consecutive calls recorded by every worker: one
    call per epoch, a very short fit) gets the slowest worker's ``step_ms`` per step, a
    lower bound of the job's, and ``step_time_from`` says so. Warm-up and redone
    steps are left out, and so are steps a profiler disturbed: the step's ``profiled``
    rows, in a multi-worker run those of any worker in the step or the call before it
    (the job's step runs from that call's end, and a profiler stops in the hooks after
    it).

    Args:
        steps: ``Report.steps`` (or one run's part of it).
        disturbed: keep the steps a profiler disturbed too.

    Returns:
        A DataFrame with ``MEASURED_STEP_COLUMNS``: one row per step record, or per
        step of a multi-worker run; ``step_ms`` in ms per step, ``step_time_from`` the
        column it comes from (``step_ms``, ``job_step_ms`` or ``SLOWEST_WORKER``).

    Example:

    ```python
    import keras_dp_tools as kdt
    from keras_dp_tools.analysis.measured_steps import measured_step_times

    report = kdt.Report.load("runs/two_workers")
    print(measured_step_times(report.steps).groupby("run")["step_ms"].median())
    ```
    """
    return measured_step_times_of(measured_step_rows(steps), disturbed)


def measured_step_rows(steps: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """What ``measured_step_times`` reads, before it leaves out the steps a profiler
    disturbed (or not): the single-worker runs' step records, and the multi-worker
    runs' steps (None: there are none)."""
    runs = multi_worker_runs(steps)
    keep = ~warmup_mask(steps)
    if "redone" in steps:
        keep &= ~steps["redone"].astype(bool)
    keep, multi = keep.to_numpy(), steps["run"].isin(runs).to_numpy()
    # One selection of the rows and columns each part reads: a copy of every step's
    # columns (then of the kept ones) doubled the memory at cluster scale.
    columns = [name for name in _MEASURED_INPUT if name in steps]
    single = steps.loc[keep & ~multi, columns].assign(step_time_from="step_ms")
    if not (keep & multi).any():
        return single, None
    by_step = _by_job_step(steps, keep & multi)
    if by_step is None:
        # Of the multi-worker runs' steps, only what the grouping reads.
        read = [name for name in (*_BY_STEP_INPUT, "examples") if name in steps]
        rows = steps.loc[keep & multi, read]
        if "job_step_ms" not in rows:  # frames made without with_job_step_ms
            rows = rows.assign(job_step_ms=float("nan"))
        if "examples" not in rows:  # frames of records written before the field
            rows = rows.assign(examples=float("nan"))
        rows, runs = run_codes(rows)
        by_step = rows.groupby(["run", "step"]).agg(
            steps=("steps", "first"),
            job_step_ms=("job_step_ms", "first"),
            slowest_step_ms=("step_ms", "max"),
            global_batch=("global_batch", "first"),
            examples=("examples", "first"),
            fewest_examples=("examples", "min"),
            most_examples=("examples", "max"),
            examples_counted=("examples", "count"),
            workers=("step", "size"),
            profiled=("profiled", "any"),
        )
        by_step.index = with_run_ids(by_step.index, runs)
    by_step = _examples_the_workers_agree_on(by_step)
    # A run with no job step time at all: the slowest worker's, and it says so.
    timed = by_step["job_step_ms"].notna().groupby(level="run").transform("any")
    by_step["job_step_ms"] = by_step["job_step_ms"].where(timed, by_step["slowest_step_ms"])
    by_step["step_time_from"] = np.where(timed, "job_step_ms", SLOWEST_WORKER)
    return single, by_step


def _by_job_step(steps: pd.DataFrame, chosen: np.ndarray) -> pd.DataFrame | None:
    """The grouping of ``measured_step_rows`` (the ``chosen`` rows by run and step: the
    first non-empty ``steps``, ``job_step_ms`` and ``global_batch``, the largest
    ``step_ms``, whether any worker was ``profiled``) without copying the rows: each
    run and step is a cell of a dense table, filled in one unbuffered pass per column
    (a copy and a grouping would hold every chosen row again). None where a
    run id or step is empty, a column is missing or of another type, or the steps are
    too sparse for a table."""
    if any(name not in steps for name in _BY_STEP_INPUT) or steps["run"].hasnans:
        return None
    types = {name: steps[name].dtype for name in ("step", "step_ms", "profiled")}
    if [types["step"].kind, types["step_ms"], types["profiled"]] != ["i", "float64", "bool"]:
        return None
    rows = np.flatnonzero(chosen)
    if not len(rows):
        return None
    codes, runs = pd.factorize(steps["run"], sort=True)
    step = steps["step"].to_numpy()[rows]
    low = step.min()
    span = int(step.max() - low) + 1
    cells = len(runs) * span
    if cells > 2 * len(rows) + 1024:
        return None
    group = codes[rows] * span + (step - low)
    present = np.flatnonzero(np.bincount(group, minlength=cells))

    def first(name: str):  # the value of the earliest row with one (a grouping's first)
        column = steps[name]
        valid = column.notna().to_numpy()[rows]
        at = np.full(cells, len(steps))  # len(steps): none
        np.minimum.at(at, group[valid], rows[valid])
        at = at[present]
        return column.array.take(np.where(at < len(steps), at, -1), allow_fill=True)

    slowest = np.full(cells, np.nan)
    np.fmax.at(slowest, group, steps["step_ms"].to_numpy()[rows])  # NaN left out
    examples = {"examples": np.nan}
    if "examples" in steps:
        counted = steps["examples"].to_numpy(dtype="float64", na_value=np.nan)[rows]
        fewest, most = np.full(cells, np.nan), np.full(cells, np.nan)
        np.fmin.at(fewest, group, counted)
        np.fmax.at(most, group, counted)
        examples = {
            "examples": first("examples"),
            "fewest_examples": fewest[present],
            "most_examples": most[present],
            "examples_counted": np.bincount(group, weights=~np.isnan(counted), minlength=cells)[
                present
            ],
            "workers": np.bincount(group, minlength=cells)[present],
        }
    profiled = np.bincount(group, weights=steps["profiled"].to_numpy()[rows], minlength=cells)
    index = pd.MultiIndex.from_arrays(
        [pd.Index(runs).take(present // span), present % span + low], names=["run", "step"]
    )
    return pd.DataFrame(
        {
            "steps": first("steps"),
            "job_step_ms": first("job_step_ms"),
            "slowest_step_ms": slowest[present],
            "global_batch": first("global_batch"),
            **examples,
            "profiled": profiled[present] > 0,
        },
        index=index,
    )


def _examples_the_workers_agree_on(by_step: pd.DataFrame) -> pd.DataFrame:
    """The job steps' ``examples`` where every worker of the run recorded the same count
    at every step, else empty for the whole run (full batches are then counted). Each
    worker reads the count off its own dataset: where workers build different datasets
    (a manual, uneven shard with ``AutoShardPolicy.OFF``), one worker's count is not the
    job's, and the steps where they happen to agree are no surer."""
    if "fewest_examples" not in by_step:
        return by_step
    differs = (by_step["fewest_examples"] != by_step["most_examples"]) & by_step[
        "most_examples"
    ].notna()
    differs |= by_step["examples_counted"].between(1, by_step["workers"] - 1, inclusive="both")
    differs = differs.groupby(level="run").transform("any")
    agreed = by_step["examples"].where(~differs.to_numpy())
    return by_step.drop(
        columns=["fewest_examples", "most_examples", "examples_counted", "workers"]
    ).assign(examples=agreed)


def measured_step_times_of(
    rows: tuple[pd.DataFrame, pd.DataFrame | None], disturbed: bool
) -> pd.DataFrame:
    """``measured_step_times`` of its ``measured_step_rows``."""
    single, by_step = rows
    if not disturbed:
        single = single[~single["profiled"].astype(bool)]
    parts = [single.assign(steps=single["steps"].fillna(1))[MEASURED_STEP_COLUMNS]]
    if by_step is not None:
        if not disturbed:
            before = by_step["profiled"].groupby(level="run").shift(1, fill_value=False)
            by_step = by_step[~(by_step["profiled"] | before.astype(bool))]
        by_step = by_step.dropna(subset=["job_step_ms"]).reset_index()
        steps = by_step["steps"].fillna(1)
        # A call's examples where recorded (a pass's smaller last batch), else full batches.
        per_step = (by_step["examples"] / steps).fillna(by_step["global_batch"])
        job = by_step.assign(
            steps=steps,
            step_ms=by_step["job_step_ms"],
            examples_per_s=per_step / by_step["job_step_ms"] * 1e3,
        )
        parts.append(job[MEASURED_STEP_COLUMNS])
    parts = [part for part in parts if not part.empty]
    measured = (
        pd.concat(parts, ignore_index=True)
        if parts
        else pd.DataFrame(columns=MEASURED_STEP_COLUMNS)
    )
    return measured.astype({"step_ms": "float64", "examples_per_s": "float64"})
