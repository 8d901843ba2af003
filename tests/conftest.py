"""Shared fixtures. TensorFlow is split into 4 logical CPU devices once per process,
before anything initialises it, so MirroredStrategy runs real all-reduces without a GPU.

On a machine with GPUs the suite runs the same way: GPUs are hidden from TensorFlow,
here and in the processes tests start (``CUDA_VISIBLE_DEVICES=""``), because the tests
compare against the CPU-device layout; GPU code paths are tested through their data
formats (XPlane traces, NVML structures). ``KERAS_DP_TEST_GPUS=1`` leaves GPUs visible.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.helpers.processes import get_json, run_cli, tensorboard_server

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
if not os.environ.get("KERAS_DP_TEST_GPUS"):
    # Before TensorFlow loads CUDA; also inherited by the CLI / demo / sweep subprocesses.
    os.environ["CUDA_VISIBLE_DEVICES"] = ""

CPU_DEVICES = 4


@pytest.fixture(scope="session")
def tf():
    import tensorflow as tf

    from keras_dp_tools import configure_devices

    if not os.environ.get("KERAS_DP_TEST_GPUS") and tf.config.list_physical_devices("GPU"):
        # TensorFlow saw GPUs anyway (imported before this file): hide them, so that
        # configure_devices splits the CPU and strategy4's /cpu:0..3 exist.
        tf.config.set_visible_devices([], "GPU")
    configure_devices(CPU_DEVICES)
    tf.config.list_logical_devices()  # initialise now: no test may change the device set
    return tf


@pytest.fixture(scope="session")
def keras(tf):
    import keras

    return keras


@pytest.fixture(scope="session")
def tf_keras(tf):
    import tf_keras

    return tf_keras


@pytest.fixture(scope="session")
def strategy4(tf):
    """One 4-replica strategy for the whole session: a second one over the same
    devices breaks collective ops ("Shape mismatch in the collective instance")."""
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(CPU_DEVICES)])


@pytest.fixture(scope="session")
def strategy1(tf):
    return tf.distribute.MirroredStrategy(["/cpu:0"])


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory):
    """A real demo run (2 replicas, 40 steps) shared by the tests that read its output."""
    log_dir = tmp_path_factory.mktemp("demo") / "run"
    result = run_cli(
        "demo", "--replicas", "2", "--steps", "40", "--epochs", "2", "--log-dir", str(log_dir)
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return log_dir, result


@pytest.fixture(scope="session")
def demo_tensorboard(demo_run):
    """A real ``tensorboard --logdir`` on the demo's log dir, on a free loopback port,
    once all its plugins are up and our scalars are loaded: (base URL, log dir)."""
    log_dir, _ = demo_run

    def scalars_loaded(base: str) -> bool:
        return "keras_dp/worker-0" in get_json(f"{base}/data/plugin/scalars/tags", timeout=5)

    with tensorboard_server(log_dir, scalars_loaded) as base:
        yield base, log_dir


@pytest.fixture(scope="session")
def builder(tf):  # the proto classes ship with TensorFlow
    from tests.helpers.xplane_builder import SpaceBuilder

    return SpaceBuilder


@pytest.fixture(scope="session")
def gpu_trace(tf):  # the proto classes ship with TensorFlow
    from tests.helpers.gpu_traces import GpuTrace

    return GpuTrace


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs mounted under tmp_path (root only), nearly filled."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        (mount / "filler").write_bytes(b"\0" * ((256 - 12) * 1024))  # 12 KiB left
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
