"""The job's step time in multi-worker runs: each step once, at the pace of the job,
not of the worker whose own time inside the train call is shortest or longest."""

import pytest

import keras_dp_tools as kdt
from keras_dp_tools.analysis.clocks import job_step_times
from keras_dp_tools.analysis.measured_steps import SLOWEST_WORKER, measured_step_times
from keras_dp_tools.records.writer import RecordWriter, worker_records_path
from tests.helpers.processes import launch_job
from tests.helpers.recorded_runs import header

GAP_MS = 2.0  # every worker's host work between two train calls (callbacks)
SLEEP_MS = 40.0  # worker 1's extra host work before each call
OWN_MS = 10.0  # the work of one step inside the call, once every worker is in
WARMUP_MS = 500.0  # the first call of the fit (tracing, compilation)
VALIDATION_MS = 300.0  # between the epochs: epoch-end callbacks, validation
CLOCKS_S = (0.0, 1000.0123)  # what each worker's clock reads when worker 0's reads 0
GLOBAL_BATCH = 64


def lockstep_run(
    log_dir,
    *,
    sleep_ms=SLEEP_MS,
    own_ms=lambda step: OWN_MS,
    steps_per_call=1,
    calls_per_epoch=12,
    epochs=2,
    lost=(),
    window=None,
    stop_ms=50.0,
    first_step=0,
    start_s=100.0,
    examples=None,
):
    """Two workers' records of one run, made the way the job runs: worker w enters call
    c when it is done with its host work after the previous call's end (``GAP_MS``, plus
    ``sleep_ms`` on worker 1); the call ends for both when the last one is in and the
    call's own work is done (``own_ms`` of each of its steps). Each worker records its
    entry on its own clock (``CLOCKS_S``) and ``step_ms`` = its time in the call per
    step. ``lost``: (worker, step) records not written. ``window``: worker 0 profiles
    the calls of steps [first, end): they run 30 ms longer, and stopping the profiler
    after the last takes worker 0 ``stop_ms`` before the next call. ``first_step`` and
    ``start_s`` (on worker 0's clock): where a new process (a restart) starts; its
    records are added to those already in ``log_dir``. ``examples(step, worker)``: the
    call's ``examples`` field on that worker, if given."""
    writers = [RecordWriter(worker_records_path(log_dir, worker)) for worker in (0, 1)]
    for worker, writer in enumerate(writers):
        writer.write(
            {**header("job", worker), "time": start_s - 1.0 + CLOCKS_S[worker]}
            | {"replicas": 2, "workers": 2, "global_batch": GLOBAL_BATCH}
            | {"pid": 10 * first_step + worker, "hostname": "h"}
        )
    call_end = start_s * 1e3  # ms on worker 0's clock
    step = first_step
    for epoch in range(epochs):
        if epoch:
            call_end += VALIDATION_MS
        for _ in range(calls_per_epoch):
            before = [GAP_MS, GAP_MS + sleep_ms]  # host work before this call
            if window and step == window[1]:
                before[0] += stop_ms
            entry = [call_end + ms for ms in before]
            own = sum(own_ms(s) for s in range(step, step + steps_per_call))
            if step == first_step:
                own = WARMUP_MS
            if window and window[0] <= step < window[1]:
                own += 30.0
            call_end = max(entry) + own
            for worker, writer in enumerate(writers):
                if (worker, step) in lost:
                    continue
                writer.write(
                    {"type": "step", "run": "job", "worker": worker, "epoch": epoch}
                    | {"step": step, "steps": steps_per_call, "warmup": step == first_step}
                    | {"time": (entry[worker] / 1e3 + CLOCKS_S[worker])}
                    | {"step_ms": (call_end - entry[worker]) / steps_per_call}
                    | ({} if examples is None else {"examples": examples(step, worker)})
                )
            step += steps_per_call
    if window:
        writers[0].write(
            {"type": "window", "run": "job", "worker": 0, "time": 100.0, "window": 0}
            | {"start_step": window[0], "end_step": window[1], "status": "analysed"}
        )
    for writer in writers:
        writer.close()
    return kdt.Report.load(log_dir)


def test_the_jobs_throughput_counts_a_smaller_last_batch_as_recorded(tmp_path):
    """Each epoch's last step (11, 23) trained on 40 examples, the others on 64."""
    report = lockstep_run(tmp_path, examples=lambda step, _: 40 if step % 12 == 11 else 64)

    measured = measured_step_times(report.steps).set_index("step")
    cadence_ms = GAP_MS + SLEEP_MS + OWN_MS  # by hand, as in the test below
    expected = [(40 if step % 12 == 11 else 64) / cadence_ms * 1e3 for step in measured.index]
    assert {11, 23} <= set(measured.index)
    assert measured["examples_per_s"].to_numpy() == pytest.approx(expected)


@pytest.mark.parametrize(
    "examples",
    [
        # Uneven shards read by each worker: passes of 12 and of 9 steps.
        lambda step, worker: 40 if step % (12 - 3 * worker) == 11 - 3 * worker else 64,
        # One worker cannot place its smaller batch.
        lambda step, worker: None if worker else (40 if step % 12 == 11 else 64),
    ],
    ids=["uneven-shards", "one-worker-unknown"],
)
def test_workers_that_count_a_steps_examples_differently_leave_the_jobs_count_unknown(
    tmp_path, examples
):
    """Each worker counts from its own dataset: where two workers' counts differ, no
    worker's is the job's, so the job's throughput counts full batches (global_batch),
    at every step of the run, even where the counts agree."""
    report = lockstep_run(tmp_path, examples=examples)

    measured = measured_step_times(report.steps).set_index("step")
    cadence_ms = GAP_MS + SLEEP_MS + OWN_MS
    assert measured["examples_per_s"].to_numpy() == pytest.approx(64 / cadence_ms * 1e3)


@pytest.mark.parametrize("steps_per_call", [1, 2])
def test_the_job_steps_at_the_slow_workers_pace_and_each_worker_shows_its_own_call(
    tmp_path, steps_per_call
):
    report = lockstep_run(tmp_path, steps_per_call=steps_per_call, lost={(1, 14)})

    # By hand: a call starts when worker 1 is done with its 2 + 40 ms between calls and
    # takes 10 ms per step; worker 0 is in 40 ms early and waits in the all-reduce.
    cadence_ms = (GAP_MS + SLEEP_MS + OWN_MS * steps_per_call) / steps_per_call
    own = report.steps.groupby("worker")["step_ms"].median()
    assert own[0] == pytest.approx((SLEEP_MS + OWN_MS * steps_per_call) / steps_per_call)
    assert own[1] == pytest.approx(OWN_MS)
    job = job_step_times(report.steps)
    assert job["job_step_ms"].to_numpy() == pytest.approx([cadence_ms] * len(job))
    # Left out: the warm-up call and the call after it; step 14, which worker 1 did not
    # record, and the call after it; the first call of epoch 1 (after validation).
    k = steps_per_call
    calls = [c * k for c in range(24)]
    left_out = {0, k, 14, 14 + k, 12 * k}
    assert job["step"].tolist() == [step for step in calls if step not in left_out]
    # Every worker's row of the step has it.
    both = report.steps.dropna(subset=["job_step_ms"]).groupby("worker")["step"].apply(list)
    assert both[0] == both[1] == job["step"].tolist()

    summary = report.summary().loc["job"]
    assert summary["step_time_from"] == "job_step_ms"
    assert summary["median_step_ms"] == pytest.approx(cadence_ms)
    assert summary["p90_step_ms"] == pytest.approx(cadence_ms)
    assert summary["examples_per_s"] == pytest.approx(GLOBAL_BATCH / cadence_ms * 1e3)
    assert summary["measured_steps"] == len(job) * k  # each step once, not once per worker
    assert report.compare().loc[0, "throughput"] == pytest.approx(GLOBAL_BATCH / cadence_ms * 1e3)
    assert "Step times vary a lot" not in [item.title for item in report.advice()]


def test_the_workers_own_step_times_mixed_would_have_looked_like_jitter(tmp_path):
    # What the summary and the advice read before: both workers' step_ms in one pool,
    # 50 ms and 10 ms; its p90 is over 1.5x its median. The job's steps do not vary.
    report = lockstep_run(tmp_path)
    steady = report.steps[~report.steps["warmup"]]["step_ms"]
    assert steady.quantile(0.9) > 1.5 * steady.median()

    assert report.summary().loc["job", "p90_step_ms"] == pytest.approx(GAP_MS + SLEEP_MS + OWN_MS)
    assert "Step times vary a lot" not in report.summary().loc["job", "advice"]
    # The straggler's share: worker 0's 40 ms wait over the job's 52 ms step.
    (straggler,) = [item for item in report.advice() if item.code == "worker-straggler"]
    assert "(77% of the job's step time)" in straggler.evidence


def test_steps_that_do_vary_in_the_job_get_the_advice(tmp_path):
    # No slow worker; every 4th step does 8x the work on both.
    report = lockstep_run(
        tmp_path, sleep_ms=0.0, own_ms=lambda step: 80.0 if step % 4 == 0 else OWN_MS
    )

    summary = report.summary().loc["job"]
    assert summary["median_step_ms"] == pytest.approx(GAP_MS + OWN_MS)
    assert summary["p90_step_ms"] == pytest.approx(GAP_MS + 80.0)
    advice = [item for item in report.advice() if item.title == "Step times vary a lot"]
    assert len(advice) == 1
    assert "p90 job step time" in advice[0].evidence


def test_a_profiler_on_one_worker_leaves_its_steps_and_the_next_out_of_the_summary(tmp_path):
    # Worker 0 profiles steps 15-16 (30 ms slower) and stops the profiler before step
    # 17 (50 ms): the job's steps 15, 16 and 17 are disturbed.
    report = lockstep_run(tmp_path, window=(15, 17))

    job = job_step_times(report.steps).set_index("step")["job_step_ms"]
    cadence_ms = GAP_MS + SLEEP_MS + OWN_MS
    assert job[[15, 16]].tolist() == pytest.approx([cadence_ms + 30.0] * 2)
    assert job[17] == pytest.approx(GAP_MS + 50.0 + OWN_MS)  # worker 0 entered last
    summary = report.summary().loc["job"]
    assert summary["p90_step_ms"] == pytest.approx(cadence_ms)
    # Steps 2-11 and 13-23 have a job step time; 15, 16 and 17 are left out.
    assert summary["measured_steps"] == 10 + 11 - 3


def test_what_if_starts_from_the_jobs_step_time_not_the_workers_pooled(tmp_path):
    lockstep_run(tmp_path, window=(15, 17))
    # Worker 0's profiled window, as its profiler records it: in the trace, 10 ms of
    # compute and 40 ms of all-reduce (it waited for worker 1), all of it exposed.
    writer = RecordWriter(worker_records_path(tmp_path, 0))
    for step in (15, 16):
        writer.write(
            {"type": "step_breakdown", "run": "job", "worker": 0, "time": 100.0}
            | {"window": 0, "step": step, "steps": 1, "step_ms": 50.0}
            | {"compute_ms": 10.0, "allreduce_ms": 40.0, "exposed_allreduce_ms": 40.0}
            | {"sync_wait_ms": 38.0, "transfer_ms": 2.0, "allreduce_bytes": 4096}
        )
    writer.close()
    report = kdt.Report.load(tmp_path)

    # (Its 2 ms of transfer went to waiting for worker 1: the link is given.)
    table = kdt.what_if(report, bandwidth_gbps=1.0)

    # The job stepped every 2 + 40 + 10 ms; the workers' own times in the call (50 ms on
    # worker 0, 10 ms on worker 1) pooled would have said 30.
    cadence_ms = GAP_MS + SLEEP_MS + OWN_MS
    assert table.loc[0, "measured_step_ms"] == pytest.approx(cadence_ms)
    # As measured, the prediction is the measured step: the 2 ms outside compute and
    # the exposed all-reduce count as host overhead.
    assert table.loc[0, "other_ms"] == pytest.approx(cadence_ms - 10.0 - 40.0)


def test_without_two_consecutive_calls_the_summary_says_it_shows_the_slowest_worker(tmp_path):
    # One call per epoch: no job step time anywhere (each interval crosses an epoch).
    report = lockstep_run(tmp_path, calls_per_epoch=1, epochs=12)

    assert job_step_times(report.steps).empty
    summary = report.summary().loc["job"]
    # Not NaN, and not the job's 2 + 40 + 10 ms: worker 0's time in the call, where it
    # waited for worker 1 (40 + 10 ms), the longer of the two; labelled a lower bound.
    assert summary["step_time_from"] == SLOWEST_WORKER
    assert summary["median_step_ms"] == pytest.approx(SLEEP_MS + OWN_MS)
    assert summary["examples_per_s"] == pytest.approx(GLOBAL_BATCH / (SLEEP_MS + OWN_MS) * 1e3)
    assert summary["measured_steps"] == 11  # the calls after the warm-up, once each
    assert "lower bound" in report.text()


def test_after_a_restart_each_step_has_the_time_of_the_attempt_that_ran_it_last(tmp_path):
    # Attempt 0 runs steps 0-11 with no slow worker (12 ms steps) and stops; attempt 1
    # resumes from a checkpoint at step 8 with worker 1 slow (52 ms steps) up to step 19.
    lockstep_run(tmp_path, sleep_ms=0.0, epochs=1)
    report = lockstep_run(tmp_path, first_step=8, start_s=200.0, epochs=1)

    job = job_step_times(report.steps).set_index("step")["job_step_ms"]
    # Attempt 0: steps 2-7 (8-11 were redone); attempt 1: from step 10 (8 is its warm-up).
    assert job.index.tolist() == [*range(2, 8), *range(10, 20)]
    assert job.loc[:7].tolist() == pytest.approx([GAP_MS + OWN_MS] * 6)
    assert job.loc[10:].tolist() == pytest.approx([GAP_MS + SLEEP_MS + OWN_MS] * 10)
    redone = report.steps[report.steps["redone"]]
    assert sorted(set(redone["step"])) == [8, 9, 10, 11]
    assert redone["job_step_ms"].isna().all()
    assert report.summary().loc["job", "measured_steps"] == 16


def test_a_single_worker_run_keeps_its_own_step_times(tmp_path):
    from tests.helpers.recorded_runs import write_run

    write_run(tmp_path, step_ms=lambda step: 10.0 + step % 3)

    report = kdt.Report.load(tmp_path)

    assert report.steps["job_step_ms"].isna().all()
    summary = report.summary().iloc[0]
    assert summary["step_time_from"] == "step_ms"
    assert summary["median_step_ms"] == 11.0


@pytest.mark.slow
def test_two_real_workers_step_at_the_pace_of_the_one_that_sleeps_between_calls(tmp_path):
    # Worker 1 sleeps 40 ms in on_train_batch_begin, before our StepTimer starts the step.
    result = launch_job(
        tmp_path,
        *("--slow-worker", "1", "--slow-ms", "40", "--epochs", "1", "--steps-per-epoch", "30"),
    )
    assert result.returncode == 0, result.stdout[-4000:]

    report = kdt.Report.load(tmp_path)

    summary = report.summary().iloc[0]
    assert summary["step_time_from"] == "job_step_ms"
    job_ms = summary["median_step_ms"]
    assert job_ms >= 40
    steady = report.steps[~report.steps["warmup"]]
    own_ms = steady.groupby("worker")["step_ms"].median()
    # A step of the job holds every worker's call: it is no shorter than either's time
    # in the call (the workers' times mixed gave a median between the two).
    assert job_ms >= own_ms.max() - 1.0
    assert own_ms[1] < 0.5 * job_ms  # worker 1's own calls are short
    # Independent measures of the fit's pace, on worker 1's clock alone from its entries
    # into the train call (no step ends, no alignment): the median time from one entry
    # to the next, and the span of its entries over the steps between them.
    mine = steady[steady["worker"] == 1]
    entry_to_entry_ms = 1e3 * mine["time"].diff().dropna()
    assert job_ms == pytest.approx(entry_to_entry_ms.median(), rel=0.1)
    span_ms = 1e3 * (mine["time"].iloc[-1] - mine["time"].iloc[0])
    assert job_ms == pytest.approx(span_ms / (len(mine) - 1), rel=0.25)
    titles = [item.title for item in report.advice()]
    assert "Step times vary a lot" not in titles, report.text()
    print(report.text())
