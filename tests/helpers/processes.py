"""Starting the CLI or the workers of a job in fresh processes, a real TensorBoard on a
log dir, and reading a local server's JSON answers."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.helpers import REPO

# The tiny training job of the fault and multi-worker tests (run as a script).
TRAIN_JOB = str(REPO / "tests" / "jobs" / "train_job.py")


def run_cli(*args: str, env: dict | None = None, timeout: float = 300, cores: int | None = None):
    """Runs ``python -m keras_dp_tools ARGS`` in a fresh process (own TF devices)."""
    return run_module("keras_dp_tools", *args, env=env, timeout=timeout, cores=cores)


def pinned_to(cores: int) -> Callable[[], None]:
    """For ``Popen(preexec_fn=)``: the child may run on the first ``cores`` of the cores
    this process may use (Linux), the same few on any machine."""
    allowed = sorted(os.sched_getaffinity(0))[:cores]
    return lambda: os.sched_setaffinity(0, allowed)


def run_module(
    module: str,
    *args: str,
    env: dict | None = None,
    timeout: float = 300,
    cores: int | None = None,
):
    """Runs ``python -m MODULE ARGS`` from the repository, ``env`` over this one's;
    on ``cores`` cores only, when given (``pinned_to``)."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        preexec_fn=pinned_to(cores) if cores else None,
    )


def worker_env(**extra: str) -> dict:
    """This process's environment for TensorFlow workers started under ``keras-dp
    launch``: TensorFlow's info logs off, Python stacks of all threads on a fatal signal
    (a crash inside TensorFlow), and no inherited run id (the launcher makes one)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONFAULTHANDLER": "1", **extra}
    env.pop("KERAS_DP_RUN_ID", None)
    return env


def launch_job(log_dir, *job_args, launch_args=(), timeout=300):
    """Runs ``tests/jobs/train_job.py LOG_DIR JOB_ARGS`` on 2 workers under
    ``keras-dp launch LAUNCH_ARGS --log-dir LOG_DIR`` (a fresh run id)."""
    command = [sys.executable, "-m", "keras_dp_tools", "launch", "--workers", "2"]
    command += [*launch_args, "--log-dir", str(log_dir), "--"]
    command += [sys.executable, TRAIN_JOB, str(log_dir), *job_args]
    return subprocess.run(
        command, env=worker_env(), capture_output=True, text=True, timeout=timeout
    )


def get_json(url: str, timeout: float = 30):
    """A JSON answer of a local server (TensorBoard's profile plugin gzips its own)."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        body = response.read()
        if response.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        return json.loads(body)


@contextmanager
def tensorboard_server(
    log_dir, ready: Callable[[str], bool], timeout: float = 120
) -> Iterator[str]:
    """A real ``tensorboard --logdir log_dir`` on a free loopback port, once the Data
    parallel tab is enabled and ``ready(base_url)`` holds; yields the base URL and stops
    the server after."""
    import pytest

    from keras_dp_tools.tools.launch import free_ports

    (port,) = free_ports(1)
    tensorboard = Path(sys.executable).with_name("tensorboard")
    server = subprocess.Popen(
        [str(tensorboard), "--logdir", str(log_dir), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"

    def serving() -> bool:
        try:
            listing = get_json(f"{base}/data/plugins_listing", timeout=5)
            return bool(listing.get("data_parallel", {}).get("enabled")) and ready(base)
        except OSError:
            return False

    try:
        deadline = time.monotonic() + timeout
        while not serving():
            if server.poll() is not None:
                pytest.fail(f"tensorboard exited: {server.stderr.read()[-2000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"tensorboard did not serve {log_dir} within {timeout:.0f} s")
            time.sleep(1)
        yield base
    finally:
        server.terminate()
        server.wait(timeout=30)


def run_workers_by_hand(
    script, *args: str, workers: int = 2, env: dict | None = None, timeout: float = 300
) -> list[subprocess.CompletedProcess]:
    """Starts ``python SCRIPT ARGS`` once per worker, as TensorFlow's multi-worker
    tutorial does (and Slurm, Kubernetes or a shell loop would): each process with its
    own ``TF_CONFIG`` on free loopback ports and nothing else shared, no
    ``KERAS_DP_RUN_ID``. Waits for all; returns their results, worker 0 first. A worker
    still running at ``timeout`` is killed (its result says so, returncode -9)."""
    from keras_dp_tools.tools.launch import free_ports, tf_config

    addresses = [f"localhost:{port}" for port in free_ports(workers)]
    base = worker_env(**(env or {}))
    processes = [
        subprocess.Popen(
            [sys.executable, str(script), *args],
            env={**base, "TF_CONFIG": tf_config(addresses, index)},
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for index in range(workers)
    ]
    results = []
    for process in processes:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
        ended = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
        results.append(ended)
    return results
