"""Two real tf_keras workers on localhost (keras-dp launch): a straggler, a SIGKILL.

Each test starts 2 TensorFlow processes; they are kept tiny and few.
"""

import os
import subprocess
import sys

import pytest

import keras_dp_tools as kdt
from keras_dp_tools.tools.launch import free_ports
from tests.helpers.processes import TRAIN_JOB, launch_job


@pytest.mark.slow
def test_a_worker_40_ms_slow_per_step_is_named_and_its_wait_is_not_transfer(tmp_path):
    result = launch_job(
        tmp_path,
        *("--slow-worker", "1", "--slow-ms", "40", "--profile-start-step", "3"),
        *("--epochs", "1", "--steps-per-epoch", "16"),
    )
    assert result.returncode == 0, result.stdout[-4000:]

    report = kdt.Report.load(tmp_path)

    steps = report.steps
    profiled = steps[(steps["worker"] == 0) & steps["trace_step_ms"].notna()]
    assert len(profiled) == 5, report.windows.to_string()
    # Worker 0's own trace holds only its replica: before the merge the 40 ms showed
    # as transfer. Now it is waiting for worker 1.
    assert profiled["sync_wait_ms"].median() >= 25
    # What is left of transfer is what a call costs the worker that waited for nobody:
    # worker 1's own train calls in the same steps (host-timed, an independent clock).
    own = steps[(steps["worker"] == 1) & steps["step"].isin(profiled["step"])]
    assert profiled["transfer_ms"].median() <= 1.5 * own["step_ms"].median() + 2.0
    titles = [item.title for item in report.advice()]
    assert "Worker 1 is a straggler" in titles, report.text()
    workers = report.workers.set_index("worker")
    assert workers.loc[0, "median_worker_wait_ms"] >= 25
    assert workers.loc[1, "last_to_enter_share"] >= 0.6
    assert workers["clock_residual_ms"].max() < 20  # one host: the clocks agree closely
    assert set(report.runs["run_id_source"]) == {"env"}  # the launcher's one id
    assert kdt.what_if(tmp_path)["run"].tolist() == report.runs["run"].unique().tolist()
    print(report.text())


@pytest.mark.slow
def test_a_worker_killed_mid_run_leaves_complete_records_and_the_report_says_who(tmp_path):
    result = launch_job(
        tmp_path,
        *("--kill-worker", "1", "--kill-at-step", "5", "--epochs", "1"),
        *("--steps-per-epoch", "12"),
        launch_args=("--grace", "3"),
    )

    assert result.returncode == 128 + 9, result.stdout[-4000:]
    assert "keras-dp launch: worker 1 was killed by SIGKILL" in result.stdout
    report = kdt.Report.load(tmp_path)
    # Every step either worker finished is on disk: both finished steps 0-5 together.
    assert report.steps.groupby("worker")["step"].apply(list).to_dict() == {
        0: list(range(6)),
        1: list(range(6)),
    }
    text = report.text()
    assert "worker 1 stopped after step 5 (was killed by SIGKILL)" in text
    assert "worker 0 stopped after step 5 (stopped by the launcher after worker 1" in text


@pytest.mark.slow
def test_a_keras3_model_under_multiworker_strategy_is_explained_once_before_training(tmp_path):
    # One worker is enough for the strategy; Keras 3 fit fails from two workers on.
    config = '{"cluster": {"worker": ["localhost:%d"]}, "task": {"type": "worker", "index": 0}}'
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TF_CONFIG": config % free_ports(1)[0]}
    result = subprocess.run(
        [sys.executable, TRAIN_JOB, str(tmp_path), "--keras", "keras", "--epochs", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert output.count("Keras 3 fit fails under MultiWorkerMirroredStrategy") == 1
    assert "TF_USE_LEGACY_KERAS=1" in output and "import tf_keras as keras" in output
