"""what_if: predictions from a measured breakdown, checked against hand-computed ring
all-reduce costs and against real runs over a rate-limited link between namespaces."""

import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pandas as pd
import pytest

from keras_dp_tools.analysis.what_if import what_if
from keras_dp_tools.report.facade import Report
from tests.helpers import REPO
from tests.helpers.netns import linked_namespaces, namespaces_unavailable, set_rate

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
            "steps": 1,
            "replicas": replicas,
            "global_batch": global_batch,
            "step_ms": step_ms,
            "examples_per_s": global_batch / step_ms * 1e3,
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


def test_logical_cpu_replicas_share_the_cores_so_compute_follows_the_examples_per_worker():
    report = _report(allreduce_ms=130.0)
    cpus = [f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(2)]
    report.runs = pd.DataFrame({"run": ["r"], "devices": [cpus]})
    row = what_if(report, replicas=4, measured_bandwidth_gbps=0.025).iloc[0]
    assert row["compute_ms"] == pytest.approx(20 * 2)  # twice the examples, same cores
    gpus = [name.replace("CPU", "GPU") for name in cpus]
    report.runs = pd.DataFrame({"run": ["r"], "devices": [gpus]})
    row = what_if(report, replicas=4, measured_bandwidth_gbps=0.025).iloc[0]
    assert row["compute_ms"] == pytest.approx(20)  # a device each


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


def _train_two_workers(ends, log_dir, rates, steps):
    """Two workers, one in each namespace, train ``steps`` steps per link rate (one
    process start for all rates); returns one Report per rate."""
    cluster = ",".join(f"{address}:23456" for _, _, address in ends)
    log_dir.mkdir(parents=True)
    env = {**os.environ, "KERAS_DP_RUN_ID": "link", "PYTHONPATH": str(REPO)}
    worker_script = str(REPO / "tests" / "jobs" / "link_worker.py")
    workers = [
        subprocess.Popen(
            ["ip", "netns", "exec", namespace, sys.executable, worker_script, str(index),
             str(log_dir), cluster, str(steps), str(len(rates))],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        )
        for index, (namespace, _, _) in enumerate(ends)
    ]  # fmt: skip
    try:
        for phase, rate in enumerate(rates):
            set_rate([(namespace, device) for namespace, device, _ in ends], rate)
            (log_dir / f"go-{phase}").touch()
            deadline = time.monotonic() + 300
            while not all((log_dir / f"done-{phase}-{i}").exists() for i in range(2)):
                assert time.monotonic() < deadline, f"phase {phase} ({rate}) took over 300 s"
                # A worker leaves once its last phase is done: early only before that.
                assert all(
                    worker.poll() is None or (log_dir / f"done-{phase}-{i}").exists()
                    for i, worker in enumerate(workers)
                ), "a worker exited early"
                time.sleep(0.2)
        outputs = [worker.communicate(timeout=120)[0] for worker in workers]
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.communicate()
    for worker, output in zip(workers, outputs, strict=True):
        assert worker.returncode == 0, output[-3000:]
    return [Report.load(log_dir / f"phase-{phase}") for phase in range(len(rates))]


def _needs_namespaces():
    reason = namespaces_unavailable()
    if reason:
        pytest.skip(reason)
    pytest.importorskip("tf_keras", reason="two-worker training needs tf_keras")


@pytest.mark.slow
def test_a_200_mbit_run_predicts_the_100_mbit_step_time_within_15_percent(tmp_path):
    _needs_namespaces()
    with linked_namespaces() as ends:
        fast, slow = _train_two_workers(ends, tmp_path / "link", ["200mbit", "100mbit"], steps=20)
    # 200 Mbit/s = 0.025 GB/s; 100 Mbit/s = 0.0125 GB/s.
    predicted = what_if(fast, bandwidth_gbps=0.0125, measured_bandwidth_gbps=0.025).iloc[0]
    measured = slow.summary(advice=False)["median_step_ms"].iloc[0]
    error = predicted["step_ms"] / measured - 1
    print(
        f"200 -> 100 Mbit/s: measured {predicted['measured_step_ms']:.0f} ms at 200, "
        f"predicted {predicted['step_ms']:.0f} ms, measured {measured:.0f} ms ({error:+.1%})"
    )
    assert abs(error) < 0.15, (predicted.to_dict(), measured)
    assert predicted["limited_by"].startswith("the link")
    # The link, not the model, set the step: half the rate took clearly longer.
    assert measured > 1.3 * predicted["measured_step_ms"]
