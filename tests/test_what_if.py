"""what_if: predictions from a measured breakdown, checked against hand-computed ring
all-reduce costs and against real runs over a rate-limited link between namespaces."""

from types import SimpleNamespace

import pandas as pd
import pytest

from keras_dp_tools.analysis.what_if import what_if

MB = 1e6


def _report(
    *,
    replicas=2,
    workers=1,
    global_batch=64,
    compute_ms=20.0,
    allreduce_ms=100.0,
    exposed_ms=None,
    wait_ms=0.0,
    other_ms=5.0,
    allreduce_bytes=2.5 * MB,
    run="r",
):
    """Steps of one run as Report.steps holds them: timed steps and a profiled window."""
    exposed_ms = allreduce_ms if exposed_ms is None else exposed_ms
    step_ms = compute_ms + exposed_ms + other_ms
    rows = []
    for step in range(12):
        profiled = 4 <= step < 8
        row = {
            "run": run,
            "worker": step % workers,
            "step": step,
            "replicas": replicas,
            "global_batch": global_batch,
            "step_ms": step_ms,
            "warmup": step == 0,
            "profiled": profiled,
        }
        if profiled:
            row.update(
                compute_ms=compute_ms,
                allreduce_ms=allreduce_ms,
                exposed_allreduce_ms=exposed_ms,
                sync_wait_ms=wait_ms,
                transfer_ms=allreduce_ms - wait_ms,
                allreduce_bytes=allreduce_bytes,
            )
        rows.append(row)
    return SimpleNamespace(steps=pd.DataFrame(rows))


def test_half_the_bandwidth_doubles_the_ring_transfer_and_keeps_the_latency():
    # 2.5 MB over 2 replicas on a 0.025 GB/s link: ring transfer 2.5 MB / 25 MB/s = 100 ms;
    # the run measured 130 ms, so 30 ms is latency.
    report = _report(allreduce_ms=130.0)
    row = what_if(report, bandwidth_gbps=0.0125, measured_bandwidth_gbps=0.025).iloc[0]
    assert row["allreduce_ms"] == pytest.approx(30 + 200)
    assert row["step_ms"] == pytest.approx(20 + 230 + 5)
    assert row["examples_per_s"] == pytest.approx(64 / 0.255)
    assert row["limited_by"].startswith("the link")
    # Same conditions: the model gives back the measured step.
    same = what_if(report, measured_bandwidth_gbps=0.025).iloc[0]
    assert same["step_ms"] == pytest.approx(same["measured_step_ms"])


def test_without_the_link_rate_the_measured_bus_bandwidth_stands_for_it():
    report = _report(allreduce_ms=130.0, wait_ms=30.0)  # transfer 100 ms: 25 MB/s bus
    row = what_if(report, bandwidth_gbps=0.05).iloc[0]
    assert row["allreduce_ms"] == pytest.approx(30 + 50)


def test_more_replicas_cost_the_ring_factor_and_compute_follows_the_batch():
    # 2 -> 4 replicas: 2(n-1)/n goes from 1 to 1.5; latency grows with the hops (1 -> 3).
    report = _report(allreduce_ms=130.0)
    row = what_if(report, replicas=4, per_replica_batch=64, measured_bandwidth_gbps=0.025)
    row = row.iloc[0]
    assert row["allreduce_ms"] == pytest.approx(30 * 3 + 150)
    assert row["compute_ms"] == pytest.approx(20 * 2)  # 32 -> 64 examples per replica
    assert row["scaling_efficiency"] == pytest.approx((40 + 5) / (40 + 240 + 5))
    one = what_if(report, workers=1, measured_bandwidth_gbps=0.025).iloc[0]
    assert one["replicas"] == 2  # workers keep the replicas per worker


def test_hidden_all_reduce_stays_hidden_up_to_the_compute_time():
    report = _report(compute_ms=50.0, allreduce_ms=60.0, exposed_ms=20.0)  # 40 ms hidden
    row = what_if(report, bandwidth_gbps=0.0125, measured_bandwidth_gbps=0.025).iloc[0]
    assert row["exposed_allreduce_ms"] == pytest.approx(200 - 40)


def test_runs_it_cannot_predict_are_refused_with_what_is_missing():
    report = _report()
    report.steps["compute_ms"] = float("nan")
    with pytest.raises(ValueError, match="DataParallelProfiler"):
        what_if(report, bandwidth_gbps=1.0)
    with pytest.raises(ValueError, match="at least 2 replicas"):
        what_if(_report(replicas=1), bandwidth_gbps=1.0)
    with pytest.raises(ValueError, match="bandwidth_gbps"):
        what_if(_report(), bandwidth_gbps=-1)
