"""The sweep's scaling advice names only the causes the runs show. No TensorFlow."""

import os

import pytest

import keras_dp_tools as kdt
from keras_dp_tools.tools.sweep import run_sweep
from tests.helpers import REPO
from tests.helpers.recorded_runs import BALANCED, COMM_HEAVY, write_run

CPU_DEVICES = [f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(4)]
GPU_DEVICES = [f"/job:localhost/replica:0/task:0/device:GPU:{i}" for i in range(4)]


def write_sweep_run(log_dir, run, replicas, step_ms, breakdown, devices, start):
    """A run as a sweep makes it (global batch 64 per replica), its devices in the header."""
    write_run(
        log_dir,
        run,
        step_ms=step_ms,
        replicas=replicas,
        global_batch=64 * replicas,
        breakdown=breakdown,
        start=start,
        header_fields={"devices": devices[:replicas]},
    )


def scaling_advice(tmp_path, devices, breakdown):
    # 4x the batch in 3.5x the time: a speed-up of 1.14, an efficiency of 29%.
    write_sweep_run(tmp_path / "n1", "one", 1, 10.0, None, devices, 1000.0)
    write_sweep_run(tmp_path / "n4", "four", 4, 35.0, breakdown, devices, 2000.0)
    advice = kdt.Report.load(tmp_path).advice()
    advice = [item for item in advice if item.title == "Scaling is poor"]
    assert len(advice) == 1
    return advice[0]


def test_on_cpu_devices_the_shared_cores_are_the_cause_not_communication(tmp_path):
    advice = scaling_advice(tmp_path, CPU_DEVICES, BALANCED)  # comm share 4%

    assert "efficiency 29%" in advice.evidence and "comm share there 4%" in advice.evidence
    assert "logical devices of one CPU" in advice.evidence
    assert "share the same CPU cores" in advice.fix
    assert "communication" not in advice.fix.lower() and "waiting" not in advice.fix.lower()
    assert advice.severity == "info"


def test_on_gpus_a_high_comm_share_points_at_the_communication_advice(tmp_path):
    advice = scaling_advice(tmp_path, GPU_DEVICES, COMM_HEAVY)  # comm share 35%

    assert "communication advice" in advice.fix
    assert "CPU" not in advice.evidence + advice.fix and advice.severity == "warning"


def test_on_gpus_with_low_communication_nothing_is_blamed_on_it(tmp_path):
    advice = scaling_advice(tmp_path, GPU_DEVICES, BALANCED)

    assert "communication advice" not in advice.fix
    assert "Communication and waiting are low" in advice.fix


@pytest.mark.parametrize("gpus", ["", "0,1,2,3"])
def test_a_sweep_without_gpus_says_its_replicas_share_the_cores(tmp_path, monkeypatch, gpus):
    script = tmp_path / "fake_train.py"
    script.write_text(
        f"import os, sys\nsys.path.insert(0, {str(REPO)!r})\n"
        "from tests.helpers.recorded_runs import write_run\n"
        "write_run(os.environ['KERAS_DP_LOG_DIR'], run='r' + os.environ['KERAS_DP_REPLICAS'])\n"
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", gpus)
    lines = []

    run_sweep(str(script), [1, 2], tmp_path / "sweep", progress=lines.append)

    said = any("share its" in line and f"{os.cpu_count()} cores" in line for line in lines)
    assert said == (gpus == "")
