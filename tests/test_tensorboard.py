"""The demo's log dir served by a real `tensorboard --logdir` on loopback shows our scalars."""

import gzip
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from .conftest import free_ports


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=5) as response:
        body = response.read()
        if response.headers.get("Content-Encoding") == "gzip":  # the profile plugin gzips
            body = gzip.decompress(body)
        return json.loads(body)


@pytest.mark.slow
def test_tensorboard_lists_our_scalars_and_profiles(demo_run):
    log_dir, _ = demo_run
    (port,) = free_ports(1)
    tensorboard = Path(sys.executable).with_name("tensorboard")
    server = subprocess.Popen(
        [str(tensorboard), "--logdir", str(log_dir), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    tags = {}
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and "keras_dp/worker-0" not in tags:
            time.sleep(1)
            if server.poll() is not None:
                pytest.fail(f"tensorboard exited: {server.stderr.read()[-2000:]}")
            try:
                tags = get_json(f"{base}/data/plugin/scalars/tags")
            except OSError:
                continue
        plugins = get_json(f"{base}/data/plugins_listing")
        profile_runs = get_json(f"{base}/data/plugin/profile/runs")
    finally:
        server.terminate()
        server.wait(timeout=30)

    assert {"dp/step_ms", "dp/examples_per_s"} <= set(tags.get("keras_dp/worker-0", {}))
    assert "train" in tags  # Keras's own TensorBoard callback, side by side
    assert "profile" in plugins  # tensorboard-plugin-profile is installed for the Profile tab
    # The Profile tab lists our profiler windows, named "<capture> (<log dir subfolder>)" or
    # "train/<capture>" depending on the plugin version.
    captures = {path.parent.name for path in log_dir.glob("train/plugins/profile/*/*.xplane.pb")}
    assert len(captures) == 3
    assert all(any(capture in str(run) for run in profile_runs) for capture in captures)
