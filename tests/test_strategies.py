"""The callbacks under the other strategies in scope: the default strategy (here),
OneDeviceStrategy, CentralStorageStrategy and ParameterServerStrategy (in their own
process, tests/jobs/strategy_runs.py, so this session's devices and strategy stay as they are)."""

import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import keras_dp_tools as kdt
from tests.helpers import REPO


def test_default_strategy_has_one_replica_and_no_communication(tmp_path, keras):
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    x = np.ones((32 * 10, 8), "float32")

    with warnings.catch_warnings():
        warnings.simplefilter("error", kdt.MeasurementWarning)
        model.fit(
            x,
            x[:, :1],
            batch_size=32,
            verbose=0,
            callbacks=kdt.callbacks(tmp_path, profile_start_step=2),
        )

    report = kdt.Report.load(tmp_path)
    assert report.runs["replicas"].tolist() == [1]
    assert report.windows["status"].tolist() == ["analysed"]
    assert len(report.replicas) == 5 and (report.replicas["replica"] == 0).all()
    assert (report.replicas["allreduce_ms"] == 0).all() and (
        report.replicas["compute_ms"] > 0
    ).all()
    assert report.summary(advice=False)["comm_share"].tolist() == [0.0]


@pytest.fixture(scope="module")
def strategy_runs(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("strategies")
    result = subprocess.run(
        [sys.executable, str(REPO / "tests" / "jobs" / "strategy_runs.py"), str(log_dir)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    fits = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return log_dir, {entry["name"]: entry for entry in fits}


def categories(entry):
    return [warning["category"] for warning in entry["warnings"]]


@pytest.mark.slow
def test_one_device_strategy_has_no_communication(strategy_runs):
    log_dir, fits = strategy_runs
    assert fits["one_device"]["ended"] == "epochs=2"
    assert "MeasurementWarning" not in categories(fits["one_device"])

    report = kdt.Report.load(log_dir / "one_device")
    assert report.runs["strategy"].tolist() == ["OneDeviceStrategy"]
    assert report.windows["status"].tolist() == ["analysed"]
    assert len(report.replicas) == 5 and (report.replicas["replica"] == 0).all()
    assert (report.replicas["allreduce_ms"] == 0).all() and (
        report.replicas["compute_ms"] > 0
    ).all()
    assert (report.replicas["comm_share"] == 0).all()


@pytest.mark.slow
def test_one_device_strategy_off_the_host_device_has_no_communication(strategy_runs):
    """A lone replica on /cpu:1 sends the step's results back to the host
    (``div_no_nan/_5:_Send``): a copy, but nothing exchanged between replicas."""
    log_dir, fits = strategy_runs
    assert fits["one_device_cpu1"]["ended"] == "epochs=2"
    replicas = kdt.Report.load(log_dir / "one_device_cpu1").replicas
    assert len(replicas) == 5 and (replicas["allreduce_ms"] == 0).all()


@pytest.mark.slow
def test_central_storage_strategy_runs_the_callbacks(strategy_runs):
    """Smoke test only: how its reductions are accounted is the breakdown's business."""
    log_dir, fits = strategy_runs
    assert fits["central_storage"]["ended"] == "epochs=2"
    assert "MeasurementWarning" not in categories(fits["central_storage"])

    report = kdt.Report.load(log_dir / "central_storage")
    assert report.runs["replicas"].tolist() == [2]
    assert report.windows["status"].tolist() == ["analysed"]
    assert sorted(report.replicas["replica"].unique()) == [0, 1]
    assert report.summary(advice=False)["steps"].iloc[0] == 19


@pytest.mark.slow
def test_parameter_server_training_is_recognised_and_said_once(strategy_runs):
    log_dir, fits = strategy_runs
    entry = fits["parameter_server"]
    # tf_keras refuses batch-level callbacks under ParameterServerStrategy: ours step back.
    assert entry["ended"] == "epochs=2"
    notes = [w for w in entry["warnings"] if w["category"] == "StrategyWarning"]
    assert len(notes) == 1 and "MeasurementWarning" not in categories(entry)
    assert "ParameterServerStrategyV2 trains asynchronously" in notes[0]["message"]
    assert "measure synchronous data parallelism" in notes[0]["message"]
    fit_line = os.path.join("tests", "jobs", "strategy_runs.py")
    assert notes[0]["file"].endswith(fit_line)

    report = kdt.Report.load(log_dir / "parameter_server")
    assert report.runs["strategy"].tolist() == ["ParameterServerStrategyV2"]
    assert report.steps.empty  # no step of asynchronous training is timed as if synchronous
    assert report.windows["status"].tolist() == ["skipped"]
    assert "parameter-server training" in report.windows["reason"].iloc[0]
    # What the note promises is still recorded: batching check, CPU usage per epoch.
    assert report.batching["code"].tolist() == ["batch-mismatch"]
    assert len(report.cpu) == 2


@pytest.mark.slow
def test_keras3_fit_under_parameter_servers_fails_upstream_not_in_our_callbacks(strategy_runs):
    """Keras 3's fit has no parameter-server support; whatever it raises is not ours."""
    entry = strategy_runs[1]["parameter_server_keras3"]
    assert "keras_dp_tools" not in entry["ended"]
    assert "MeasurementWarning" not in categories(entry)
