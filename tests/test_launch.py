"""keras-dp launch: workers with TF_CONFIG, prefixed output, one run id, fail-fast."""

import os
import subprocess
import sys

import pytest

import keras_dp_tools as kdt
from keras_dp_tools.tools.launch import cluster_addresses, launch
from tests.helpers import REPO
from tests.helpers.processes import run_cli

SHOW_CONFIG = (
    "import json, os; config = json.loads(os.environ['TF_CONFIG']); "
    "print(config['task']['index'], ','.join(config['cluster']['worker']), "
    "os.environ['KERAS_DP_RUN_ID'])"
)


def test_local_workers_get_their_tf_config_and_one_run_id(monkeypatch):
    monkeypatch.delenv("KERAS_DP_RUN_ID", raising=False)
    addresses = cluster_addresses(3, None)
    lines = []

    status = launch([sys.executable, "-c", SHOW_CONFIG], addresses, print_line=lines.append)

    assert status == 0
    shown = sorted(line for line in lines if line.startswith("[worker "))
    assert len(shown) == 3
    run_ids = set()
    for index, line in enumerate(shown):
        task, cluster, run_id = line.split("] ", 1)[1].split()
        assert line.startswith(f"[worker {index}] ") and task == str(index)
        assert cluster.split(",") == addresses
        run_ids.add(run_id)
    assert len(run_ids) == 1 and run_ids.pop().startswith("job-")
    ports = [address.split(":")[1] for address in addresses]
    assert len(set(ports)) == 3 and all(address.startswith("localhost:") for address in addresses)


def test_a_failing_worker_stops_the_others_and_its_status_is_the_jobs():
    worker = (
        "import json, os, sys, time\n"
        "index = json.loads(os.environ['TF_CONFIG'])['task']['index']\n"
        "if index == 1:\n"
        "    time.sleep(0.5); print('worker 1 fails', flush=True); sys.exit(3)\n"
        "try:\n"
        "    print('worker 0 ready', flush=True); time.sleep(120)\n"
        "except KeyboardInterrupt:\n"
        "    print('worker 0 interrupted', flush=True)\n"
        "    sys.exit(1)\n"
    )
    lines = []

    status = launch(
        [sys.executable, "-c", worker], cluster_addresses(2, None), print_line=lines.append
    )

    assert status == 3
    assert "[worker 1] worker 1 fails" in lines
    assert "keras-dp launch: worker 1 exited with status 3; stopping the other workers" in lines
    assert "[worker 0] worker 0 interrupted" in lines  # stopped, and could clean up


def test_a_worker_deaf_to_sigint_is_killed_after_the_grace_period():
    worker = (
        "import json, os, signal, sys, time\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "print('ready', flush=True)\n"
        "if json.loads(os.environ['TF_CONFIG'])['task']['index'] == 1:\n"
        "    time.sleep(0.5); os.kill(os.getpid(), signal.SIGKILL)\n"
        "time.sleep(120)\n"
    )
    lines = []

    status = launch(
        [sys.executable, "-c", worker],
        cluster_addresses(2, None),
        grace_s=1,
        print_line=lines.append,
    )

    assert status == 128 + 9
    assert any("worker 1 was killed by SIGKILL" in line for line in lines)
    assert "keras-dp launch: worker 0 did not stop in 1 s; killing it" in lines


def test_host_lists_and_bad_arguments_are_explained():
    assert cluster_addresses(None, "node1:3000, node2") == ["node1:3000", "node2:2222"]
    with pytest.raises(ValueError, match="--workers 3 but --host-list names 2 host"):
        cluster_addresses(3, "a,b")
    with pytest.raises(ValueError, match="give --workers N"):
        cluster_addresses(None, None)
    with pytest.raises(ValueError, match=r"none of the workers .* is on this machine"):
        launch([sys.executable, "-c", "pass"], ["node-elsewhere.invalid:2222"])
    result = run_cli("launch", "--workers", "2")
    assert result.returncode == 2 and "no command to launch" in result.stderr


@pytest.mark.slow
def test_launch_runs_the_multiworker_example_from_a_fresh_clone(tmp_path):
    clone = tmp_path / "clone"
    cloned = subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], capture_output=True)
    if cloned.returncode != 0:
        pytest.skip(f"not a git checkout: {cloned.stderr.decode()[-300:]}")
    log_dir = tmp_path / "logs"
    env = {
        **os.environ,
        "PYTHONPATH": str(clone),
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PYTHONFAULTHANDLER": "1",
    }
    env.pop("KERAS_DP_RUN_ID", None)
    command = [sys.executable, "-m", "keras_dp_tools", "launch", "--workers", "2", "--"]
    command += [sys.executable, "examples/multiworker_fit.py", str(log_dir)]

    result = subprocess.run(
        command, cwd=clone, env=env, capture_output=True, text=True, timeout=300
    )

    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "[worker 0] worker 0 done" in result.stdout
    assert "[worker 1] worker 1 done" in result.stdout
    report = kdt.Report.load(log_dir)
    assert sorted(report.runs["worker"]) == [0, 1] and report.runs["run"].nunique() == 1
    assert report.runs["run"].iloc[0].startswith("job-")
    assert report.workers["ended"].tolist() == ["finished", "finished"]
    assert report.steps.groupby("worker")["step"].max().to_dict() == {0: 9, 1: 9}
