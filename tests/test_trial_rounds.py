"""The rounds machinery of compare_strategies and tune_allreduce (tools/tuning/rounds.py),
on trial processes without TensorFlow (tests/jobs/toy_trial.py): a candidate of several
processes fails as soon as one of them fails, and Ctrl-C leaves no trial behind."""

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from keras_dp_tools.tools.tuning.child import ChildFailed
from keras_dp_tools.tools.tuning.rounds import Group, Launch
from tests.helpers import REPO
from tests.jobs.toy_trial import PORT_ERROR

TOY = "tests.jobs.toy_trial"


def launch(tmp_path, behaviour: str, index: int) -> Launch:
    spec = {"behaviour": behaviour, "log_dir": str(tmp_path)}
    return Launch(TOY, spec, tmp_path / f"worker-{index}.log", {"PYTHONPATH": str(REPO)})


def trial_processes(marker) -> list:
    """Processes alive with ``marker`` in their command line (zombies are dead)."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        if process.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if str(marker) in " ".join(process.info["cmdline"] or []):
            found.append(process)
    return found


@pytest.mark.parametrize(("behaviour", "contract"), [("raise", False), ("contract", True)])
def test_a_worker_that_fails_fails_its_candidate_at_once_not_at_the_timeout(
    tmp_path, behaviour, contract
):
    # Worker 0 hangs, as MultiWorkerMirroredStrategy's worker 0 waits for a lost peer;
    # waiting for it first would hide worker 1's error behind the timeout.
    group = Group([launch(tmp_path, "hang", 0), launch(tmp_path, behaviour, 1)])
    started = time.monotonic()
    try:
        with pytest.raises(ChildFailed) as failed:
            group.wait(timeout=120)
    finally:
        group.close(timeout=0)
    assert time.monotonic() - started < 20  # a Python start-up, far from the 120 s
    assert "timed out" not in str(failed.value)
    expected = PORT_ERROR if behaviour == "raise" else "make_dataset must take global_batch"
    assert expected in str(failed.value)
    assert failed.value.contract is contract
    assert trial_processes(tmp_path) == []


def test_a_group_answers_when_all_its_processes_have_answered(tmp_path):
    group = Group([launch(tmp_path, "ready", 0), launch(tmp_path, "ready", 1)])
    try:
        ready = group.wait(timeout=120)
        assert ready["strategy"] == "Toy"
        # Candidates start together: each TensorFlow process must not map all GPU memory.
        assert ready["allow_growth"] == "true"
        assert group.request({"time": 7}, timeout=60)["steps"] == 7
    finally:
        group.close()
    assert trial_processes(tmp_path) == []


def test_ctrl_c_stops_the_tuning_and_every_trial_within_seconds(tmp_path):
    # Its own session, as a terminal's foreground job: SIGINT goes to its process group.
    parent = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "jobs" / "interrupted_rounds.py"), str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        start_new_session=True,
    )
    try:
        assert parent.stdout.readline().strip() == "waiting"
        deadline = time.monotonic() + 30
        while len(trial_processes(tmp_path)) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)  # the parent and its two trials
        assert len(trial_processes(tmp_path)) == 3
        os.killpg(parent.pid, signal.SIGINT)
        started = time.monotonic()
        parent.wait(timeout=60)
        assert time.monotonic() - started < 5
        assert "KeyboardInterrupt" in parent.stdout.read()
        assert trial_processes(tmp_path) == []
    finally:
        for process in trial_processes(tmp_path):
            process.kill()
