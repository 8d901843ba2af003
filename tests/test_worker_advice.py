"""The advice about a multi-worker job's late worker (``analysis.worker_advice``), on
runs written by ``tests.helpers.cluster_records``: every worker enters each step up to
0.4 ms after the first, the late worker ``straggler_ms`` later, and all leave the
all-reduce together. Its numbers are checked against that injected delay and the step
ends in the records, not against the analysis's own columns."""

import re

import numpy as np
import pytest

from keras_dp_tools.analysis.worker_advice import late_worker_cost
from keras_dp_tools.report.facade import Report
from tests.helpers.cluster_records import write_cluster_run

WORKERS = 8
REPLICAS_PER_WORKER = 2
STEPS = 300
ENTRY_SPREAD_MS = 0.4  # the generator's spread of the workers' entries into a step


def cluster(path, **given) -> Report:
    settings = dict(
        workers=WORKERS,
        steps=STEPS,
        replicas_per_worker=REPLICAS_PER_WORKER,
        windows=((100, 105),),
        straggler=3,
        straggler_ms=3.0,
    )
    write_cluster_run(path, **{**settings, **given})
    return Report.load(path)


def worker_findings(report: Report) -> list:
    return [item for item in report.advice() if item.code == "worker-straggler"]


def mean_job_step_ms(report: Report) -> float:
    """The job's mean step on worker 0's own clock, from its recorded step ends (entry
    plus time in the call), over the steps after the warm-up."""
    mine = report.steps[report.steps["worker"] == 0].sort_values("step")
    ends = (mine["time"] + mine["step_ms"] / 1e3).to_numpy()
    return float(np.diff(ends)[1:].mean() * 1e3)  # the step after the warm-up on


def test_a_worker_late_by_a_small_share_is_named_with_its_cost(tmp_path):
    report = cluster(tmp_path)

    (finding,) = worker_findings(report)

    assert str(finding.severity) == "info"  # 3 ms of a ~55 ms step
    assert finding.title == "Worker 3 is a straggler"
    evidence = finding.evidence
    assert "entered the step last in 100% of the steps" in evidence
    # Each other worker waited the injected 3 ms, give or take the entries' spread.
    waited = float(re.search(r"waited a median ([\d.]+) ms per step", evidence).group(1))
    assert waited == pytest.approx(3.0, abs=ENTRY_SPREAD_MS / 2)
    assert f"the other {WORKERS - 1} workers" in evidence
    # Times all the job's replicas: the device time idle per step.
    replicas = WORKERS * REPLICAS_PER_WORKER
    idle = float(re.search(r"([\d,]+) replica-ms per step", evidence).group(1).replace(",", ""))
    assert idle == pytest.approx(3.0 * replicas, rel=0.1)
    assert f"the job's {replicas} replicas" in evidence
    # Without it, a step would start when the next-latest worker entered: the 3 ms less
    # that worker's lead (under the 0.4 ms spread).
    cost = late_worker_cost(report.steps, report.runs["run"].iloc[0], 3)
    assert 3.0 - ENTRY_SPREAD_MS <= cost["gain_ms"] <= 3.0
    assert cost["last_steps"] == cost["timed_steps"] == STEPS - 1
    assert f"{cost['gain_ms']:.1f} ms shorter on average" in evidence
    assert cost["gain_share"] == pytest.approx(cost["gain_ms"] / mean_job_step_ms(report), rel=0.02)
    # Its own step times are the shortest: it enters last and waits least.
    own = report.steps[~report.steps["warmup"]].groupby("worker")["step_ms"].median()
    assert own.idxmin() == 3
    assert "Its own step times (inside the train call) are the shortest" in evidence


def test_a_worker_that_holds_back_a_large_share_is_a_warning_ranked_by_its_cost(tmp_path):
    report = cluster(tmp_path, straggler_ms=12.0)

    (finding,) = worker_findings(report)

    assert str(finding.severity) == "warning"  # 12 ms of a ~65 ms step: a symptom, ranked
    assert finding.explains_ms_per_step == pytest.approx(12, rel=0.2)  # by what it costs
    waited = float(re.search(r"waited a median ([\d.]+) ms", finding.evidence).group(1))
    assert waited == pytest.approx(12.0, abs=ENTRY_SPREAD_MS / 2)


def test_no_late_worker_no_finding(tmp_path):
    # Every worker enters within the same 0.4 ms: each is last in about 1 of 8 steps.
    report = cluster(tmp_path, straggler=-1)

    shares = report.workers["last_to_enter_share"]
    assert shares.max() < 0.6
    assert worker_findings(report) == []


def test_a_worker_last_by_a_negligible_wait_is_not_named(tmp_path):
    # Worker 3 enters 0.3 ms late: last in most steps, but the others wait ~0.4 ms of a
    # ~110 ms step, under the 1% the advice names.
    report = cluster(tmp_path, straggler_ms=0.3, step_ms=100.0)

    late = report.workers.set_index("worker")["last_to_enter_share"]
    assert late.idxmax() == 3 and late.max() >= 0.6
    assert worker_findings(report) == []
