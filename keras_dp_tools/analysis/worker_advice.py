"""The advisor's finding about a multi-worker job's late worker, with its cost to the job.

Pure functions over the record frames (``Report.workers`` and ``Report.steps``; no
TensorFlow). A worker that enters most steps last keeps every other worker waiting in
the all-reduce: at 64 workers a few ms per step is a small share of one worker's step
but the same share of every replica's time. So the finding names such a worker even
when the share is small (``info``), and grades it ``error`` when the share is large.

Its cost is measured two ways on the same aligned clocks (``analysis.clocks``):
``others_wait_ms``, the median time the other workers waited per step for the last
worker (what every other replica idles), and ``gain_ms``, what the job would gain per
step without the lateness: in each step that worker entered last, how much later than
the second-to-last worker it entered (the step could have started that much earlier),
averaged over all timed steps (a step it did not hold back gains nothing).
"""

from __future__ import annotations

import pandas as pd

from keras_dp_tools.analysis import workers as worker_analysis
from keras_dp_tools.analysis.worker_digest import LATE_WORKER_SHARE, shortest_own_steps
from keras_dp_tools.common.findings import Advice, Finding

WORKER_WAIT_SHARE = 0.10  # the others' median wait over the job's step time: error
WORKER_WAIT_NOTE_SHARE = 0.01  # ... from this share: info (every replica idles that long)
WORKER_MIN_STEPS = 10  # timed steps every worker recorded, before naming a slow worker
CLOCK_MARGIN = 3.0  # the wait must exceed this many times the clocks' residual

_FIXES = {
    "host": "Move the extra work out of that worker's step loop (callbacks, logging, "
    "Python-side preprocessing), or find what else runs on its machine.",
    "input": "Speed up that worker's input pipeline: prefetch(tf.data.AUTOTUNE), "
    "parallel map, data local to the machine.",
    "compute": "Check that worker's devices: clocks and temperature, other processes, "
    "a slower GPU model than its peers.",
    "unknown": "The slowness is inside its train call (input or compute): profile that "
    "worker too (DataParallelProfiler(all_workers=True); with TensorFlow 2.21 that may "
    "crash it, keras-dp docs multiworker: rehearse on a short run first).",
}


def late_worker_cost(steps: pd.DataFrame, run, worker: int) -> dict:
    """What one worker's lateness costs its run, from the steps' cross-worker columns
    (``worker_wait_ms``, ``last_worker``: ``Report.steps``).

    Args:
        steps: the steps (every worker's), with ``run, worker, step, worker_wait_ms,
            last_worker, job_step_ms, step_ms``.
        run: the run id.
        worker: the late worker's index.

    Returns:
        A dict: ``timed_steps`` (steps with a cross-worker wait), ``last_steps`` (of
        those, the steps it entered last), ``gain_ms`` (mean over the timed steps of
        how much later than the second-to-last worker it entered, 0 where it was not
        last: the time each step could have saved without its lateness; NaN without
        timed steps).

    Example:

    ```python
    report = kdt.Report.load("runs/job")
    print(late_worker_cost(report.steps, report.runs["run"].iloc[0], 1)["gain_ms"])
    ```
    """
    # The columns first, then the rows: a mask over every column copies them all.
    names = ["run", "worker", "step", "step_ms", "worker_wait_ms", "last_worker", "job_step_ms"]
    columns = steps[names]
    mine = columns[(columns["run"] == run) & columns["worker_wait_ms"].notna()]
    by_step = mine.groupby("step")["job_step_ms"].first().to_frame()
    held = mine[(mine["last_worker"] == worker) & (mine["worker"] != worker)]
    # The worker that entered second-to-last waited least for the last one.
    by_step["margin"] = held.groupby("step")["worker_wait_ms"].min()
    by_step["margin"] = by_step["margin"].fillna(0.0)
    timed = len(by_step)
    paced = by_step.dropna(subset=["job_step_ms"])
    job_ms = paced["job_step_ms"].sum()
    return {
        "timed_steps": timed,
        "last_steps": int(held["step"].nunique()),
        "gain_ms": float(by_step["margin"].mean()) if timed else float("nan"),
        "gain_share": float(paced["margin"].sum() / job_ms) if job_ms > 0 else float("nan"),
        # The same steps' own times (its median the lowest: it waits least).
        "shortest_own_steps": shortest_own_steps(mine, run, worker),
    }


def late_worker_findings(frames) -> list[Finding]:
    """The worker the others wait for (``analysis.workers.straggler``), as a finding with
    its cost to the whole job: ``info`` from ``WORKER_WAIT_NOTE_SHARE`` of the job's step
    time, ``error`` from ``WORKER_WAIT_SHARE``; none where no worker enters
    ``LATE_WORKER_SHARE`` of the steps last, or the wait is within the clocks' residual.

    Args:
        frames: a ``RunFrames`` of one run (``analysis.run_frames``).

    Returns:
        A list with the finding (code ``worker-straggler``), or empty.

    Example:

    ```python
    for finding in late_worker_findings(kdt.Report.load("runs/job")):
        print(finding)
    ```
    """
    if "median_worker_wait_ms" not in frames.workers:
        return []
    parts = frames.step_parts  # the wide steps frame is not built
    # The straggler's profiled input and compute: on the rows with a breakdown.
    found = worker_analysis.straggler(frames.workers, parts.profiled)
    if found is None or found["last_share"] < LATE_WORKER_SHARE:
        return []
    steps = parts.all
    # Over the job's step time (each step once), profiled steps too: a short run may
    # have few undisturbed ones.
    job_step_ms = parts.measured(disturbed=True)["step_ms"].median()
    waited = found["others_wait_ms"]
    share = waited / job_step_ms
    cost = late_worker_cost(steps, found["run"], found["worker"])
    # The wait must stand out of the clocks' disagreement, over enough steps.
    clear = waited > CLOCK_MARGIN * found["clock_residual_ms"]
    if not (share >= WORKER_WAIT_NOTE_SHARE and clear and cost["timed_steps"] >= WORKER_MIN_STEPS):
        return []
    evidence = _evidence(frames, found, job_step_ms, cost)
    severity = "warning" if share >= WORKER_WAIT_SHARE else "info"
    title = f"Worker {found['worker']} is a straggler"
    gain = cost["gain_ms"]  # what the job's steps lose to its lateness
    explains = float(gain) if pd.notna(gain) and gain > 0 else float(waited)
    return [
        Advice(
            severity,
            title,
            evidence,
            _FIXES[found["why"]],
            code="worker-straggler",
            explains_ms_per_step=explains,
        )
    ]


def _evidence(frames, found, job_step_ms, cost) -> str:
    worker, waited = found["worker"], found["others_wait_ms"]
    mine = frames.runs[frames.runs["run"] == found["run"]]
    replicas = mine["replicas"].max() if "replicas" in mine else None
    view = frames.workers
    others = view.loc[view["run"] == found["run"], "worker"].nunique() - 1
    text = (
        f"worker {worker} entered the step last in {found['last_share']:.0%} of the steps; "
        f"the other {_workers(others)} waited a median {waited:.1f} ms per step for it "
        f"({waited / job_step_ms:.0%} of the job's step time)"
    )
    if pd.notna(replicas) and replicas > 0:
        text += (
            f": {waited * replicas:,.0f} replica-ms per step across the job's "
            f"{int(replicas)} replicas"
        )
    gain = cost["gain_ms"]
    if pd.notna(gain) and gain > 0:
        text += (
            f"; without its lateness the job's steps would be {gain:.1f} ms shorter on "
            f"average (the mean of how much later it entered than the next-latest "
            f"worker, over {cost['timed_steps']} steps"
        )
        share = cost["gain_share"]
        if pd.notna(share) and share < 1:  # of the job's time: its throughput gain
            text += f"; {share:.1%} of the job's time, {share / (1 - share):.1%} more throughput"
        text += ")"
    text += f"; clocks aligned at the step ends within {found['clock_residual_ms']:.2f} ms"
    if found["detail"]:
        text += f"; {found['detail']}"
    if cost["shortest_own_steps"]:
        text += (
            ". Its own step times (inside the train call) are the shortest of all "
            "workers: it enters last and waits least; the job's step time is "
            "job_step_ms in Report.steps"
        )
    return text + "."


def _workers(count: int) -> str:
    return "worker" if count == 1 else f"{count} workers"
