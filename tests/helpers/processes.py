"""Starting the CLI in a fresh process, and reading a local server's JSON answers."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import urllib.request

from tests.helpers import REPO


def run_cli(*args: str, env: dict | None = None, timeout: float = 300):
    """Runs ``python -m keras_dp_tools ARGS`` in a fresh process (own TF devices)."""
    return run_module("keras_dp_tools", *args, env=env, timeout=timeout)


def run_module(module: str, *args: str, env: dict | None = None, timeout: float = 300):
    """Runs ``python -m MODULE ARGS`` from the repository, ``env`` over this one's."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )


def worker_env(**extra: str) -> dict:
    """This process's environment for TensorFlow workers started under ``keras-dp
    launch``: TensorFlow's info logs off, Python stacks of all threads on a fatal signal
    (a crash inside TensorFlow), and no inherited run id (the launcher makes one)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONFAULTHANDLER": "1", **extra}
    env.pop("KERAS_DP_RUN_ID", None)
    return env


def get_json(url: str, timeout: float = 30):
    """A JSON answer of a local server (TensorBoard's profile plugin gzips its own)."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        body = response.read()
        if response.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        return json.loads(body)
