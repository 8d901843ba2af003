"""Workers of a job: restarts, who stopped where, and who kept the others waiting.

Pure functions over the record frames (no TensorFlow). Every worker of a
multi-worker job records its own steps with host timestamps: ``time`` when the
train call was entered and ``time + step_ms * steps`` when it returned. Within one
step all workers leave the all-reduce at nearly the same instant, so the step ends
are a shared event: the median difference of a worker's step ends from worker 0's is
its clock offset, and the spread around that median (``clock_residual_ms``) says how
well the clocks are aligned. On aligned clocks, a worker that entered a step late kept
the others waiting in the all-reduce for the difference (``worker_wait_ms``).

What the host timestamps cannot see: a worker that entered on time but was slow
inside the train call (its input pipeline or compute) delays the others just as much,
yet all workers enter and leave together. Only a profiler trace of that worker shows it.

A worker's ``step_ms`` is its own time inside the train call: a worker slow *between*
calls shows a short one, the workers waiting for it a long one. The job advances once
per step of its slowest worker: ``job_step_ms`` is that step time, from one shared step
end to the next (``job_step_times``), and ``measured_step_times`` says which step time a
run's statistics read.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

# The columns this analysis adds to Report.steps (restarts and cross-worker waiting).
WORKER_STEP_COLUMNS = [
    "attempt",  # the process that recorded the step: 0, then 1 after a restart, ...
    "redone",  # a later attempt ran this step again (it resumed from an earlier checkpoint)
    "worker_wait_ms",  # multi-worker: waited for the last worker to enter the step
    "last_worker",  # multi-worker: the worker that entered the step last
    "job_step_ms",  # multi-worker: the job's step time, shared step end to the next
]
WORKER_COLUMNS = [
    "run",
    "worker",
    "attempt",
    "pid",
    "hostname",
    "first_step",
    "last_step",
    "step_records",
    "ended",
    "exit",
    "exit_code",  # the process's status where the launcher recorded it (negative: signal)
    "clock_offset_ms",
    "clock_residual_ms",
    "median_worker_wait_ms",
    "median_host_gap_ms",
    "last_to_enter_share",
]
RESTART_COLUMNS = [
    "run",
    "worker",
    "attempt",
    "time",
    "resumed_at_step",
    "previous_last_step",
    "redone_steps",
]
# job_step_times: one row per run and step of a multi-worker run.
JOB_STEP_COLUMNS = ["run", "step", "job_step_ms"]
# measured_step_times: the steps behind a run's step-time statistics.
MEASURED_STEP_COLUMNS = ["run", "step", "steps", "step_ms", "examples_per_s", "step_time_from"]
# A multi-worker run without the job's step time (no two consecutive calls recorded by
# every worker: one call per epoch, a very short fit): the slowest worker's time inside
# each call, a lower bound of the job's step (it leaves out the host work between calls).
SLOWEST_WORKER = "step_ms (slowest worker: a lower bound)"
SYNC_COLUMNS = [
    "run",
    "worker",
    "step",
    "worker_wait_ms",
    "last_worker",
    "clock_offset_ms",
    "clock_residual_ms",
]


def attempts(headers: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, worker, attempt): each process that wrote the run's records
    (a restart under the same ``KERAS_DP_RUN_ID`` is a new process), by start time.

    ``headers`` needs ``run, worker, time, pid, hostname``.
    """
    columns = ["run", "worker", "attempt", "time", "pid", "hostname"]
    if headers.empty:
        return pd.DataFrame(columns=columns)
    started = (
        headers.groupby(["run", "worker", "hostname", "pid"], dropna=False, sort=False)["time"]
        .min()
        .reset_index()
        .sort_values(["run", "worker", "time"], kind="stable")
    )
    started["attempt"] = started.groupby(["run", "worker"]).cumcount()
    started["worker"] = started["worker"].astype("int64")
    return started[columns].reset_index(drop=True)


def assign_attempts(steps: pd.DataFrame, starts: pd.DataFrame) -> pd.DataFrame:
    """Adds ``attempt`` (the process that recorded the step) and ``redone`` (a later
    attempt ran this step again: it restarted from an earlier checkpoint) to steps."""
    starts = starts.dropna(subset=["time"])
    if steps.empty or starts.empty or not starts["attempt"].astype(bool).any():
        # No restart: every step is its worker's attempt 0 (the match below would say
        # so too, at a second per million steps).
        return steps.assign(attempt=0, redone=False)
    # The match needs only these columns, not every one; _row is the step's position.
    keys = steps[["run", "worker", "time"]].assign(_row=np.arange(len(steps)))
    timed = keys.dropna(subset=["time", "worker"])
    timed = timed.sort_values("time", kind="stable")
    timed = timed.astype({"worker": "int64", "time": "float64"})
    matched = pd.merge_asof(
        timed,
        starts[["run", "worker", "time", "attempt"]]
        .astype({"time": "float64"})
        .sort_values("time"),
        on="time",
        by=["run", "worker"],
        direction="backward",
    )
    attempt = np.zeros(len(steps), dtype="int64")
    found = matched["attempt"].notna().to_numpy()
    attempt[matched["_row"].to_numpy()[found]] = matched["attempt"].to_numpy()[found]
    steps = steps.assign(attempt=attempt)
    first = steps.groupby(["run", "worker", "attempt"])["step"].min().rename("first")
    later = first.reset_index().rename(columns={"attempt": "later"})
    later = later.merge(steps[["run", "worker"]].drop_duplicates(), on=["run", "worker"])
    redone = np.zeros(len(steps), dtype=bool)
    for row in later.itertuples():
        redone |= (
            (steps["run"] == row.run)
            & (steps["worker"] == row.worker)
            & (steps["attempt"] < row.later)
            & (steps["step"] >= row.first)
        ).to_numpy()
    return steps.assign(redone=redone)


def restarts(steps: pd.DataFrame, starts: pd.DataFrame) -> pd.DataFrame:
    """One row per restart: where the new attempt resumed, the previous attempt's
    last recorded step, and how many steps it ran again (``RESTART_COLUMNS``)."""
    rows = []
    for (run, worker), group in starts.groupby(["run", "worker"], sort=False):
        for previous, current in zip(group.itertuples(), group.iloc[1:].itertuples(), strict=False):
            mine = steps[(steps["run"] == run) & (steps["worker"] == worker)]
            before = mine[mine["attempt"] == previous.attempt]["step"]
            after = mine[mine["attempt"] == current.attempt]["step"]
            resumed = after.min() if len(after) else None
            rows.append(
                {
                    "run": run,
                    "worker": worker,
                    "attempt": current.attempt,
                    "time": current.time,
                    "resumed_at_step": resumed,
                    "previous_last_step": before.max() if len(before) else None,
                    "redone_steps": int((before >= resumed).sum()) if resumed is not None else 0,
                }
            )
    return pd.DataFrame(rows, columns=RESTART_COLUMNS)


def cross_worker_sync(steps: pd.DataFrame) -> pd.DataFrame:
    """Per run, worker and step of multi-worker runs: how long the worker waited for the
    last worker to enter the step (``worker_wait_ms``, on aligned clocks) and which
    worker that was (``SYNC_COLUMNS``). Warm-up steps and redone steps are left out."""
    return cross_worker_sync_of(clock_tables(steps))


def clock_tables(steps: pd.DataFrame) -> dict[str, _ByStep]:
    """Per multi-worker run, the tables of its usable steps (``_usable``) that both
    ``cross_worker_sync`` and ``job_step_times`` read: built once for both, with their
    clocks (at 64 workers x 100,000 steps each pass cost seconds)."""
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
    """Adds each step's wait for other workers (``cross_worker_sync``) and, in profiled
    steps, moves it from ``transfer_ms`` (where a worker's own trace shows it) to
    ``sync_wait_ms``; the shares and bandwidths that read those columns follow."""
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


def _warmup(steps: pd.DataFrame) -> pd.Series:
    return steps["warmup"].astype("boolean").fillna(False).astype(bool)


def _by_run(steps: pd.DataFrame):
    """``steps.groupby("run", sort=False)``'s groups; the frame itself where it holds
    one run (a group is a copy: of millions of rows)."""
    runs = steps["run"]
    if len(runs) and runs.notna().all() and (runs == runs.iloc[0]).all():
        yield runs.iloc[0], steps
        return
    yield from steps.groupby("run", sort=False)


def _usable(steps: pd.DataFrame) -> _ByStep:
    """The tables of one run's steps that the clocks read: not warm-up, not redone,
    timed, once per worker and step (the last record)."""
    keep = ~_warmup(steps)
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
    from one factorization of the keys instead of an unstack per column (seconds at
    millions of steps)."""

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
    from keras_dp_tools.analysis.workers import job_step_times

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
    and worker. Sorted steps are summed in their blocks (grouping millions of steps on
    the run id took a second)."""
    counts = steps["steps"].fillna(1)
    blocks = _sorted_blocks(steps, ["run", "worker"])
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
    from keras_dp_tools.analysis.workers import measured_step_times

    report = kdt.Report.load("runs/two_workers")
    print(measured_step_times(report.steps).groupby("run")["step_ms"].median())
    ```
    """
    return _measured_step_times(_measured_step_rows(steps), disturbed)


def _measured_step_rows(steps: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """What ``measured_step_times`` reads, before it leaves out the steps a profiler
    disturbed (or not): the single-worker runs' step records, and the multi-worker
    runs' steps (None: there are none)."""
    runs = multi_worker_runs(steps)
    keep = ~_warmup(steps)
    if "redone" in steps:
        keep &= ~steps["redone"].astype(bool)
    keep, multi = keep.to_numpy(), steps["run"].isin(runs).to_numpy()
    # One selection of the rows and columns each part reads: a copy of every step's
    # columns (then of the kept ones) cost ~0.5 GB at 64 workers x 100,000 steps.
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
        rows, runs = _run_codes(rows)
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
        by_step.index = _with_run_ids(by_step.index, runs)
    by_step = _examples_the_workers_agree_on(by_step)
    # A run with no job step time at all: the slowest worker's, and it says so.
    timed = by_step["job_step_ms"].notna().groupby(level="run").transform("any")
    by_step["job_step_ms"] = by_step["job_step_ms"].where(timed, by_step["slowest_step_ms"])
    by_step["step_time_from"] = np.where(timed, "job_step_ms", SLOWEST_WORKER)
    return single, by_step


def _by_job_step(steps: pd.DataFrame, chosen: np.ndarray) -> pd.DataFrame | None:
    """The grouping of ``_measured_step_rows`` (the ``chosen`` rows by run and step: the
    first non-empty ``steps``, ``job_step_ms`` and ``global_batch``, the largest
    ``step_ms``, whether any worker was ``profiled``) without copying the rows: each
    run and step is a cell of a dense table, filled in one unbuffered pass per column
    (the copy and the grouping held ~1 GB at 64 workers x 100,000 steps). None where a
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


def _run_codes(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.Index | None]:
    """The frame with its run ids as integer codes (in the order the ids sort) and the
    ids: a grouping by run hashes each row's string (seconds at millions of rows); by
    code it orders the groups as by id. Where an id is empty, the frame as it is and
    None (the grouping leaves those rows out)."""
    if frame["run"].hasnans:
        return frame, None
    codes, runs = pd.factorize(frame["run"], sort=True)
    return frame.assign(run=codes), pd.Index(runs, name="run")


def _with_run_ids(index: pd.MultiIndex, runs: pd.Index | None) -> pd.MultiIndex:
    """A grouping's index by run code and more with the run ids (``_run_codes``) back."""
    if runs is None:
        return index
    return index.set_levels(runs.take(index.levels[0]), level="run")


def _measured_step_times(
    rows: tuple[pd.DataFrame, pd.DataFrame | None], disturbed: bool
) -> pd.DataFrame:
    """``measured_step_times`` of its ``_measured_step_rows``."""
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


def worker_view(
    steps: pd.DataFrame,
    starts: pd.DataFrame,
    fit_ends: pd.DataFrame,
    sync: pd.DataFrame,
    exits: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """One row per run, worker and attempt (``WORKER_COLUMNS``): the steps it recorded,
    how its fit ended (``finished``; ``exited`` when the process left inside the fit, an
    exception; empty when it recorded no end: killed, or still running), how its
    process ended where ``keras-dp launch --log-dir`` recorded it (``exit``, and its
    status ``exit_code``), its clock
    offset and alignment residual, the median time it waited for other workers, its
    median host time between train calls, and how often it was the last to enter."""
    if steps.empty and starts.empty:
        return pd.DataFrame(columns=WORKER_COLUMNS)
    covered = steps[["run", "worker", "attempt", "step", "time"]].assign(
        last=steps["step"] + steps["steps"].fillna(1) - 1
    )
    recorded, group = _by_attempt(covered)
    # The grouping's codes follow recorded's rows (computed once for both).
    recorded["median_host_gap_ms"] = _host_gaps(steps, group, recorded)
    view = starts.set_index(["run", "worker", "attempt"]).join(recorded, how="outer")
    view = view.reset_index()
    view["ended"] = _endings(view, fit_ends)
    if exits is not None and not exits.empty:  # the launcher's word, for the last attempt
        last = exits.drop_duplicates(["run", "worker"], keep="last")
        last = last.astype({"worker": "int64"}).rename(columns={"reason": "exit"})
        latest = ~view.duplicated(["run", "worker"], keep="last")
        ended = last[["run", "worker", "exit", "exit_code"]]
        view = view.merge(ended, on=["run", "worker"], how="left")
        view.loc[~latest.to_numpy(), ["exit", "exit_code"]] = None
    if not sync.empty:
        coded, runs = _run_codes(sync)  # millions of rows: grouped by run code
        per_worker = coded.groupby(["run", "worker"]).agg(
            clock_offset_ms=("clock_offset_ms", "first"),
            clock_residual_ms=("clock_residual_ms", "first"),
            median_worker_wait_ms=("worker_wait_ms", "median"),
        )
        per_worker.index = _with_run_ids(per_worker.index, runs)
        last = coded.drop_duplicates(["run", "step"])
        share = last.groupby("run")["last_worker"].value_counts(normalize=True).rename("share")
        share.index = _with_run_ids(share.index, runs)
        share = share.reset_index()
        share = share.rename(columns={"last_worker": "worker"}).set_index(["run", "worker"])
        per_worker = per_worker.join(share["share"].rename("last_to_enter_share"))
        view = view.merge(per_worker.reset_index(), on=["run", "worker"], how="left")
    view = view.reindex(columns=WORKER_COLUMNS)
    view["last_to_enter_share"] = view["last_to_enter_share"].astype("float64")
    view["exit_code"] = view["exit_code"].astype("Int64")
    view.loc[view["median_worker_wait_ms"].notna(), "last_to_enter_share"] = view[
        "last_to_enter_share"
    ].fillna(0.0)
    return view.sort_values(["run", "worker", "attempt"]).reset_index(drop=True)


def _endings(view: pd.DataFrame, fit_ends: pd.DataFrame) -> list:
    endings = []
    following = view.groupby(["run", "worker"])["time"].shift(-1)  # next attempt's start
    for row, until in zip(view.itertuples(), following, strict=True):
        ends = fit_ends[(fit_ends["run"] == row.run) & (fit_ends["worker"] == row.worker)]
        if pd.notna(row.time):  # this attempt's ends: after its start, before the next
            ends = ends[ends["time"] >= row.time]
        if pd.notna(until):
            ends = ends[ends["time"] < until]
        if pd.notna(row.last_step_time):  # a later fit of the process that never ended
            ends = ends[ends["time"] >= row.last_step_time]
        endings.append(ends["status"].iloc[-1] if len(ends) else None)
    return endings


def _by_attempt(covered: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """Per run, worker and attempt (sorted): the first and last step covered, the step
    records and the last one's time; and each row's group there. Sorted steps are
    reduced in their blocks (a grouping of millions of steps on three keys took
    seconds); others grouped."""
    keys = ["run", "worker", "attempt"]
    blocks = _sorted_blocks(covered, keys)
    if blocks is None:
        by_attempt = covered.groupby(keys)
        recorded = by_attempt.agg(
            first_step=("step", "min"),
            last_step=("last", "max"),
            step_records=("step", "size"),
            last_step_time=("time", "max"),
        )
        return recorded, by_attempt.ngroup().to_numpy()
    starts, group = blocks
    first = covered.iloc[starts]
    index = pd.MultiIndex.from_arrays([first[name] for name in keys], names=keys)

    def reduced(name, ufunc):  # fmin, fmax: NaN left out, as the grouping does
        column = covered[name]
        values = ufunc.reduceat(column.to_numpy(dtype="float64", na_value=np.nan), starts)
        return values.astype(column.dtype) if column.dtype.kind in "iu" else values

    recorded = pd.DataFrame(
        {
            "first_step": reduced("step", np.fmin),
            "last_step": reduced("last", np.fmax),
            "step_records": np.diff(np.append(starts, len(covered))),
            "last_step_time": reduced("time", np.fmax),
        },
        index=index,
    )
    return recorded, group


def _sorted_blocks(frame: pd.DataFrame, keys: list[str]) -> tuple[np.ndarray, np.ndarray] | None:
    """Where the rows are sorted by ``keys`` (the run first, then integer keys) with
    no key empty: the first row of each block of equal keys, and each row's block;
    else None."""
    if frame.empty or frame[keys].isna().to_numpy().any():
        return None
    run, _ = pd.factorize(frame[keys[0]], sort=True)
    others = [frame[name] for name in keys[1:]]
    if not all(column.dtype.kind in "iu" for column in others):
        return None
    columns = [run, *(column.to_numpy() for column in others)]
    later = np.zeros(len(frame) - 1, dtype=bool)  # the row after is in a later block
    same = np.ones(len(frame) - 1, dtype=bool)
    for values in columns:
        if (same & (values[1:] < values[:-1])).any():
            return None  # not sorted
        later |= same & (values[1:] > values[:-1])
        same &= values[1:] == values[:-1]
    starts = np.flatnonzero(np.append(True, later))
    group = np.cumsum(np.append(True, later)) - 1
    return starts, group


def _host_gaps(steps: pd.DataFrame, group: np.ndarray, recorded: pd.DataFrame) -> np.ndarray:
    """Per attempt (row of ``recorded``; ``group`` numbers each step's row there): the
    median time between one train call's return and the next call (callbacks,
    Python-side work of the training loop) in ms, NaN with fewer than two timed steps."""
    timed = (~_warmup(steps) & steps["time"].notna() & steps["step_ms"].notna()).to_numpy()
    step = steps["step"].to_numpy(dtype="float64", na_value=np.nan)[timed]
    group = group[timed]
    ordered = (group[1:] > group[:-1]) | (group[1:] == group[:-1]) & (step[1:] >= step[:-1])
    # By attempt, then step: sorted steps are in that order already (no sort of millions).
    order = None if ordered.all() else np.lexsort((step, group))
    if order is not None:
        group, step = group[order], step[order]
    same = group[1:] == group[:-1]
    if (same & (step[1:] == step[:-1])).any():  # which of two equal steps is first is moot
        rows = recorded.index.to_frame(index=False).itertuples()
        return np.array([_host_gap(steps, row) for row in rows], dtype="float64")

    def column(name):
        values = steps[name].to_numpy(dtype="float64", na_value=np.nan)[timed]
        return values if order is None else values[order]

    start = column("time")
    end = start + column("step_ms") * column("steps") / 1e3
    gap = (start[1:] - end[:-1])[same] * 1e3
    return _block_medians(gap, group[1:][same], len(recorded))


def _block_medians(values: np.ndarray, group: np.ndarray, groups: int) -> np.ndarray:
    """The median of the values of each group ``0 .. groups - 1`` (NaN left out; NaN
    where a group has none), for ``group`` sorted ascending: one slice per group."""
    medians = np.full(groups, np.nan)
    bounds = np.searchsorted(group, np.arange(groups + 1))
    for number, (first, end) in enumerate(itertools.pairwise(bounds)):
        mine = values[first:end]
        mine = mine[~np.isnan(mine)]
        if len(mine):
            medians[number] = np.median(mine)
    return medians


def _host_gap(steps: pd.DataFrame, row) -> float:
    """``_host_gaps`` of one attempt, where it recorded a step twice."""
    mine = steps[(steps["run"] == row.run) & (steps["worker"] == row.worker)]
    mine = mine[(mine["attempt"] == row.attempt) & ~_warmup(mine)]
    mine = mine.dropna(subset=["time", "step_ms"]).sort_values("step")
    if len(mine) < 2:
        return float("nan")
    end = mine["time"] + mine["step_ms"] * mine["steps"].astype("float64") / 1e3
    gap = (mine["time"].shift(-1) - end).iloc[:-1] * 1e3
    return float(gap.median())


def straggler(view: pd.DataFrame, steps: pd.DataFrame) -> dict | None:
    """The worker the others waited for most, with the evidence, or None.

    ``why`` is ``host`` when the worker spends longer between train calls than the
    others (its callbacks or Python-side work), ``input`` or ``compute`` when its own
    profiled steps show it, else ``unknown``.
    """
    timed = view.dropna(subset=["median_worker_wait_ms"])
    if timed["worker"].nunique() < 2:
        return None
    latest = timed.drop_duplicates(["run", "worker"], keep="last")
    slow = latest.sort_values("last_to_enter_share").iloc[-1]
    others = latest[latest["worker"] != slow["worker"]]
    waited = others["median_worker_wait_ms"].median()
    result = {
        "run": slow["run"],
        "worker": int(slow["worker"]),
        "last_share": float(slow["last_to_enter_share"]),
        "others_wait_ms": float(waited),
        "clock_residual_ms": float(latest["clock_residual_ms"].max()),
        "why": "unknown",
        "detail": "",
    }
    gap, other_gap = slow["median_host_gap_ms"], others["median_host_gap_ms"].median()
    if pd.notna(gap) and pd.notna(other_gap) and gap - other_gap > 0.5 * waited:
        result["why"] = "host"
        result["detail"] = (
            f"it spends {gap:.1f} ms between train calls (callbacks, Python-side work) "
            f"against {other_gap:.1f} ms on the others"
        )
        return result
    parts = [part for part in ("input_ms", "compute_ms") if part in steps]
    steps = steps[["run", "worker", *parts]]  # not a copy of every column, twice
    mine = steps[(steps["run"] == slow["run"]) & (steps["worker"] == slow["worker"])]
    theirs = steps[(steps["run"] == slow["run"]) & (steps["worker"] != slow["worker"])]
    for part in ("input_ms", "compute_ms"):
        if part in steps and mine[part].notna().any() and theirs[part].notna().any():
            extra = mine[part].median() - theirs[part].median()
            if extra > 0.5 * waited:
                result["why"] = part.removesuffix("_ms")
                result["detail"] = f"its profiled {part} is {extra:.1f} ms above the others'"
                return result
    return result
