"""Cross-worker clocks: each worker's clock offset from worker 0's, the wait for the
last worker to enter each step, and the job's step time.

Every worker of a multi-worker job records its own steps with host timestamps: ``time``
when the train call was entered and ``time + step_ms * steps`` when it returned. Within
one step all workers leave the all-reduce at nearly the same instant, so the step ends
are a shared event: the median difference of a worker's step ends from worker 0's is
its clock offset, and the spread around that median (``clock_residual_ms``) says how
well the clocks are aligned. On aligned clocks, a worker that entered a step late kept
the others waiting in the all-reduce for the difference (``worker_wait_ms``). The job
advances once per step of its slowest worker: ``job_step_ms`` is that step time, from
one shared step end to the next (``job_step_times``).

What the host timestamps cannot see: a worker that entered on time but was slow inside
the train call (its input pipeline or compute) delays the others just as much, yet all
workers enter and leave together. Only a profiler trace of that worker shows it.

Pure functions over the steps frame; no TensorFlow.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from keras_dp_tools.analysis.step_keys import warmup_mask

# job_step_times: one row per run and step of a multi-worker run.
JOB_STEP_COLUMNS = ["run", "step", "job_step_ms"]


SYNC_COLUMNS = [
    "run",
    "worker",
    "step",
    "worker_wait_ms",
    "last_worker",
    "clock_offset_ms",
    "clock_residual_ms",
]


def cross_worker_sync(steps: pd.DataFrame) -> pd.DataFrame:
    """Per run, worker and step of multi-worker runs: how long the worker waited for the
    last worker to enter the step, and which worker that was.

    Warm-up steps and redone steps are left out.

    Args:
        steps: ``Report.steps``; reads ``run, worker, epoch, step, steps, time, step_ms,
            warmup``, and ``attempt`` and ``redone`` where present.

    Returns:
        A DataFrame with ``SYNC_COLUMNS`` (``worker_wait_ms`` on aligned clocks); empty
        when no run has two workers.

    Example:

    ```python
    import keras_dp_tools as kdt
    from keras_dp_tools.analysis.clocks import cross_worker_sync

    sync = cross_worker_sync(kdt.Report.load("runs/two_workers").steps)
    print(sync.groupby("worker")["worker_wait_ms"].median())
    ```
    """
    return cross_worker_sync_of(clock_tables(steps))


def clock_tables(steps: pd.DataFrame) -> dict[str, _ByStep]:
    """Per multi-worker run, the tables of its usable steps (``_usable``) that both
    ``cross_worker_sync`` and ``job_step_times`` read: built once for both, with their
    clocks (each pass is costly at cluster scale)."""
    if steps["worker"].nunique() < 2:  # no run has two workers: skip the grouping
        return {}
    return {
        run: _usable(group)
        for run, group in _by_run(_clock_input(steps))
        if group["worker"].nunique() >= 2
    }


def cross_worker_sync_of(tables: dict[str, _ByStep]) -> pd.DataFrame:
    """``cross_worker_sync`` of the runs' ``clock_tables``."""
    frames = [_run_sync(run, by_step) for run, by_step in tables.items()]
    if not frames:
        return pd.DataFrame(columns=SYNC_COLUMNS)
    return pd.concat(frames, ignore_index=True)[SYNC_COLUMNS]


def with_worker_wait(steps: pd.DataFrame, sync: pd.DataFrame) -> pd.DataFrame:
    """The steps with each step's wait for other workers, moved out of the transfer.

    In profiled steps the wait moves from ``transfer_ms`` (where a worker's own trace
    shows it) to ``sync_wait_ms``; the shares and bandwidths that read those columns
    follow.

    Args:
        steps: steps with the breakdown's columns (``step_parts.with_breakdown``).
        sync: ``cross_worker_sync`` of the same steps.

    Returns:
        The steps with ``worker_wait_ms`` and ``last_worker`` (empty without ``sync``).
    """
    if sync.empty:
        return steps.assign(worker_wait_ms=float("nan"), last_worker=pd.NA)
    steps = steps.drop(columns=["worker_wait_ms", "last_worker"], errors="ignore").merge(
        sync[["run", "worker", "step", "worker_wait_ms", "last_worker"]],
        on=["run", "worker", "step"],
        how="left",
    )
    steps["last_worker"] = steps["last_worker"].astype("Int64")
    wait = steps["worker_wait_ms"].fillna(0.0)
    old_transfer = steps["transfer_ms"].astype("float64")
    for total, waited in (
        ("transfer_ms", "sync_wait_ms"),
        ("exposed_transfer_ms", "exposed_sync_wait_ms"),
    ):
        moved = np.minimum(wait, steps[total].astype("float64")).where(steps[total].notna())
        steps[total] = steps[total] - moved.fillna(0.0)
        steps[waited] = steps[waited] + moved.fillna(0.0)
        if total == "transfer_ms":  # every local replica waited that long for the worker
            steps["max_sync_wait_ms"] = steps["max_sync_wait_ms"] + moved.fillna(0.0)
    # The shares as docs/breakdown.md defines them, on the moved times.
    profiled = steps["trace_step_ms"]
    steps["comm_share"] = (steps["exposed_transfer_ms"] / profiled).where(profiled > 0)
    steps["wait_share"] = (steps["exposed_sync_wait_ms"] / profiled).where(profiled > 0)
    faster = old_transfer / steps["transfer_ms"].astype("float64")  # bandwidth ~ 1 / time
    for name in ("algbw_gbps", "busbw_gbps"):
        steps[name] = (steps[name] * faster).where(steps["transfer_ms"] > 0)
    return steps


def _by_run(steps: pd.DataFrame):
    """``steps.groupby("run", sort=False)``'s groups; the frame itself where it holds
    one run (a group is a copy of its rows)."""
    runs = steps["run"]
    if len(runs) and runs.notna().all() and (runs == runs.iloc[0]).all():
        yield runs.iloc[0], steps
        return
    yield from steps.groupby("run", sort=False)


def _usable(steps: pd.DataFrame) -> _ByStep:
    """The tables of one run's steps that the clocks read: not warm-up, not redone,
    timed, once per worker and step (the last record)."""
    keep = ~warmup_mask(steps)
    if "redone" in steps:
        keep &= ~steps["redone"].astype(bool)
    keep = (keep & steps["time"].notna() & steps["step_ms"].notna()).to_numpy()
    if _strictly_by_worker_and_step(steps, keep):  # no duplicates to drop (sorted steps)
        return _ByStep(steps, keep)  # the rows kept, without copying every column
    return _ByStep(steps[keep].drop_duplicates(["worker", "step"], keep="last"))


def _strictly_by_worker_and_step(steps: pd.DataFrame, rows: np.ndarray) -> bool:
    """Whether the ``rows`` are sorted by worker and step with no (worker, step) twice,
    checked on integer keys (False where they are not integers or are empty)."""
    keys = [steps[name] for name in ("worker", "step")]
    if not all(key.dtype.kind in "iu" for key in keys):
        return False
    worker, step = (key.to_numpy()[rows] for key in keys)
    later = (worker[1:] > worker[:-1]) | (worker[1:] == worker[:-1]) & (step[1:] > step[:-1])
    return bool(later.all())


class _ByStep:
    """Columns of one run's usable steps (unique per worker and step) as tables by step
    (rows, ascending) and worker (columns, ascending): what ``DataFrame.pivot`` gives,
    from one factorization of the keys instead of an unstack per column."""

    def __init__(self, steps: pd.DataFrame, rows: np.ndarray | None = None):
        self.steps, self.rows = steps, rows  # rows: a mask of the rows to read (None: all)
        step, worker = (self._column(name) for name in ("step", "worker"))
        step_codes, self.step_index = pd.factorize(step, sort=True)
        worker_codes, self.worker_index = pd.factorize(worker, sort=True)
        self.usable = (step_codes >= 0) & (worker_codes >= 0)
        self.everywhere = bool(self.usable.all())
        # Each row's cell in the flat table, by worker then step: a 1-D put, in order
        # for sorted steps, is several times a 2-D one's speed.
        self.cells = (worker_codes * len(self.step_index) + step_codes)[self.usable]
        self._clocks = None

    def clocks(self) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.Series]:
        """``_clocks`` of the tables and each worker's clock offset (the median skew),
        computed once: the sync and the job's step times read them both."""
        if self._clocks is None:
            start, end, skew = _clocks(self)
            self._clocks = start, end, skew, skew.median()
        return self._clocks

    def __contains__(self, column: str) -> bool:
        return column in self.steps

    def _column(self, name: str) -> pd.Series:
        column = self.steps[name]
        return column if self.rows is None else column[self.rows]

    def table(self, column: str) -> pd.DataFrame:
        """``steps.pivot(index="step", columns="worker", values=column)`` as float64."""
        values = np.full(len(self.step_index) * len(self.worker_index), np.nan)
        given = self.steps[column].to_numpy(dtype="float64", na_value=np.nan)
        if self.rows is not None:
            given = given[self.rows]
        values[self.cells] = given if self.everywhere else given[self.usable]
        # A frame keeps a 2-D block by column: the worker-major array is that block.
        values = values.reshape(len(self.worker_index), len(self.step_index)).T
        return pd.DataFrame(
            values,
            index=pd.Index(self.step_index, name="step"),
            columns=pd.Index(self.worker_index, name="worker"),
            copy=False,
        )


def _clocks(by_step: _ByStep) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Of one run's usable steps (``_usable``) that every worker recorded, by step (rows)
    and worker (columns): when each worker entered the train call and left it, in ms on
    its own clock, and how far each worker's step end is from the first worker's
    (``skew``: its median over steps is the worker's clock offset)."""
    start = by_step.table("time") * 1e3  # ms
    duration = by_step.table("step_ms") * by_step.table("steps")
    start = start.dropna()  # steps every worker recorded
    end = start + duration.reindex_like(start)
    skew = end.sub(end.iloc[:, 0], axis=0) if len(end.columns) else end
    return start, end, skew


def _run_sync(run: str, by_step: _ByStep) -> pd.DataFrame:
    start, _, skew, offset = by_step.clocks()
    residual = skew.sub(offset, axis=1).abs().median()  # per worker, ms
    aligned = start - offset
    last_entry = aligned.max(axis=1)
    wait = aligned.rsub(last_entry, axis=0)
    last_worker = aligned.idxmax(axis=1)
    # wait.stack() by step, then worker, built from the arrays (a stack and a map per
    # column of millions of rows took seconds).
    workers = len(wait.columns)
    rows = pd.DataFrame(
        {
            "step": np.repeat(wait.index.to_numpy(), workers),
            "worker": np.tile(wait.columns.to_numpy(), len(wait)),
            "worker_wait_ms": wait.to_numpy(dtype="float64").ravel(),
        }
    )
    rows["run"] = run
    rows["last_worker"] = np.repeat(last_worker.to_numpy(dtype="int64"), workers)
    rows["clock_offset_ms"] = np.tile(offset.to_numpy(dtype="float64"), len(wait))
    rows["clock_residual_ms"] = np.tile(residual.to_numpy(dtype="float64"), len(wait))
    return rows


def job_step_times(steps: pd.DataFrame) -> pd.DataFrame:
    """Per run and step of multi-worker runs: the job's step time, ``job_step_ms``.

    All workers leave a step's all-reduce together, so the end of a step is one instant
    for the whole job, and from one step's end to the next the job ran one train call,
    however long any worker took before it (callbacks, Python-side work) or inside it.
    ``job_step_ms`` is that interval divided by the steps the call ran
    (``steps_per_execution``). It covers the host work before the call and the call.

    Why the step ends rather than the starts (the last worker to enter): the ends are the
    event the clocks are aligned on (``cross_worker_sync``), so the end of a step is read
    on every worker's clock, aligned, and the median taken; a constant clock offset
    cancels in the difference of two ends. The last entry is one worker's reading, with
    that worker's alignment error in it.

    Left out (no row): warm-up calls and redone steps (a later attempt ran them again),
    steps some worker did not record, and a step whose previous call is not the one just
    before it in the same epoch and attempt on every worker: after a missing step or an
    epoch boundary (epoch-end callbacks and validation are not step time; a worker's own
    ``step_ms`` leaves them out as well).

    Args:
        steps: ``Report.steps``; reads ``run, worker, epoch, step, steps, time,
            step_ms, warmup``, and ``attempt`` and ``redone`` where present.

    Returns:
        A DataFrame with ``JOB_STEP_COLUMNS`` (``job_step_ms`` in ms per step), by
        step within each run; empty when no run has two workers.

    Example:

    ```python
    import keras_dp_tools as kdt
    from keras_dp_tools.analysis.clocks import job_step_times

    report = kdt.Report.load("runs/two_workers")
    print(job_step_times(report.steps)["job_step_ms"].median())
    ```
    """
    return _job_step_times(clock_tables(steps))


def _job_step_times(tables: dict[str, _ByStep]) -> pd.DataFrame:
    """``job_step_times`` of the runs' ``clock_tables``."""
    frames = [_run_job_steps(run, by_step) for run, by_step in tables.items()]
    frames = [frame for frame in frames if not frame.empty]
    if not frames:
        return pd.DataFrame(columns=JOB_STEP_COLUMNS)
    return pd.concat(frames, ignore_index=True)[JOB_STEP_COLUMNS]


def _run_job_steps(run: str, tables: _ByStep) -> pd.DataFrame:
    _, end, _, offset = tables.clocks()
    if end.shape[1] < 2 or len(end) < 2:  # no two steps every worker recorded
        return pd.DataFrame(columns=JOB_STEP_COLUMNS)
    shared_end = end.sub(offset, axis=1).median(axis=1)  # ms, on worker 0's clock

    def by_step(column: str) -> pd.DataFrame:
        return tables.table(column).reindex(index=end.index, columns=end.columns)

    calls = by_step("steps").astype("float64")
    step = pd.Series(end.index.to_numpy(dtype="float64"), index=end.index)
    # Every worker's previous call ran the steps just before this one...
    follows = calls.shift(1).add(step.shift(1), axis=0).eq(step, axis=0).all(axis=1)
    follows &= _one_value(calls)
    # ... in the same epoch and process (NaN compares unequal: left out).
    for name in ("epoch", "attempt"):
        if name in tables:
            within = by_step(name)
            follows &= within.eq(within.shift(1)).all(axis=1)
    job_step_ms = (shared_end.diff() / calls.iloc[:, 0]).where(follows).dropna()
    return pd.DataFrame(
        {
            "run": run,
            "step": job_step_ms.index.to_numpy(),
            "job_step_ms": job_step_ms.to_numpy(dtype="float64"),
        }
    )


def _one_value(table: pd.DataFrame) -> pd.Series:
    """Per row: whether its non-empty values are one value (``nunique(axis=1) == 1``,
    without a Python call per row)."""
    values = table.to_numpy(dtype="float64")
    present = ~np.isnan(values)
    low = np.where(present, values, np.inf).min(axis=1, initial=np.inf)
    high = np.where(present, values, -np.inf).max(axis=1, initial=-np.inf)
    return pd.Series(present.any(axis=1) & (low == high), index=table.index)


def _clock_input(steps: pd.DataFrame) -> pd.DataFrame:
    """The columns of the steps that the clock alignment reads: grouping and filtering
    the wide ``Report.steps`` copied ~50 columns of every row."""
    return steps[[name for name in _CLOCK_COLUMNS if name in steps]]


_CLOCK_COLUMNS = ["run", "worker", "epoch", "step", "steps", "time", "step_ms", "warmup"]
_CLOCK_COLUMNS += ["attempt", "redone"]


def with_job_step_ms(steps: pd.DataFrame, tables: dict | None = None) -> pd.DataFrame:
    """Adds ``job_step_ms`` (``job_step_times``) to every worker's row of the step;
    NaN in single-worker runs and where the job's step time is left out. ``tables``:
    the ``clock_tables`` of the same steps where they were built already."""
    job = _job_step_times(clock_tables(steps) if tables is None else tables)
    steps = steps.drop(columns="job_step_ms", errors="ignore")
    if job.empty:
        return steps.assign(job_step_ms=float("nan"))
    found = _job_step_at(steps, job)
    if found is None:
        job = job.astype({"step": steps["step"].dtype})
        steps = steps.merge(job, on=["run", "step"], how="left")
    else:  # the merge's result, without hashing and copying every step
        steps = steps.reset_index(drop=True).assign(job_step_ms=found)
    if "redone" in steps:  # the step's time is the attempt's that ran it last
        steps["job_step_ms"] = steps["job_step_ms"].where(~steps["redone"].astype(bool))
    return steps


def _job_step_at(steps: pd.DataFrame, job: pd.DataFrame) -> np.ndarray | None:
    """Each step's ``job_step_ms`` (NaN: none), found by run and step as a left merge
    would; None where the steps are not integers."""
    if steps["step"].dtype.kind not in "iu":
        return None
    step = steps["step"].to_numpy()
    found = np.full(len(steps), np.nan)
    for run, rows in job.groupby("run", sort=False):  # one row per step of each run
        mine = (steps["run"] == run).to_numpy(dtype=bool, na_value=False)
        order = np.argsort(rows["step"].to_numpy(dtype="int64"), kind="stable")
        keys = rows["step"].to_numpy(dtype="int64")[order]
        values = rows["job_step_ms"].to_numpy(dtype="float64")[order]
        if not len(keys):
            continue
        at = np.minimum(np.searchsorted(keys, step[mine]), len(keys) - 1)
        found[mine] = np.where(keys[at] == step[mine], values[at], np.nan)
    return found
