"""GPU and CPU monitoring: the reader without NVML, the sampler thread, step alignment.

No GPU exists here: NVML's absence is the real path under test, and the monitor is
also driven by a recorded stream of readings through the reader interface.
"""

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pandas as pd
import pytest

from keras_dp_tools.analysis.utilization import (
    epoch_gpu_summary,
    interval_means,
    step_gpu_utilization,
    utilization_findings,
)
from keras_dp_tools.capture.monitor.host_usage import HostCpuMeter
from keras_dp_tools.capture.monitor.nvml_reader import (
    NvmlReader,
    NvmlUnavailable,
    visible_nvml_indices,
)
from keras_dp_tools.capture.monitor.sampler import THREAD_NAME, Sampler
from tests.helpers import REPO
from tests.helpers.nvml_fake import nvml_works
from tests.helpers.processes import pinned_to


def sampler_threads():
    return [thread for thread in threading.enumerate() if thread.name == THREAD_NAME]


@pytest.mark.skipif(nvml_works(), reason="this machine has NVML")
def test_reader_says_why_nvml_is_unavailable():
    with pytest.raises(NvmlUnavailable, match=r"NVML could not start .*LibraryNotFound"):
        NvmlReader().open()


def test_cuda_visible_devices_map_to_nvml_identities():
    assert visible_nvml_indices(2, {}) == [0, 1]
    assert visible_nvml_indices(2, {"CUDA_VISIBLE_DEVICES": "3, 1,0"}) == [3, 1]
    assert visible_nvml_indices(1, {"CUDA_VISIBLE_DEVICES": "GPU-8f2a"}) == ["GPU-8f2a"]
    with pytest.raises(NvmlUnavailable, match="lists 1 GPU"):
        visible_nvml_indices(2, {"CUDA_VISIBLE_DEVICES": "1"})


def test_reader_imports_without_tensorflow_or_pandas():
    code = (
        "import sys\n"
        "for name in ('tensorflow', 'pandas', 'numpy', 'pyarrow'): sys.modules[name] = None\n"
        "from keras_dp_tools.capture.monitor.nvml_reader import NvmlReader\n"
        "import keras_dp_tools\n"
        "print('ok', keras_dp_tools.__version__)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok")


def test_comparison_script_explains_a_machine_without_gpus():
    if nvml_works():
        pytest.skip("this machine has NVML: the script would really compare")
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / "nvml_vs_nvidia_smi.py"), "--seconds", "1"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": ""},
    )
    assert result.returncode == 2
    assert "No NVML here" in result.stderr


def test_host_cpu_meter_sees_a_busy_process():
    meter = HostCpuMeter()
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:
        pass
    usage = meter.read()
    assert usage["process_cpu_percent"] > 30  # one core busy is 100 (less if the machine is shared)
    assert usage["cpu_count"] >= 1
    assert usage["system_cpu_percent"] is None or 0 <= usage["system_cpu_percent"] <= 100


def test_host_cpu_meter_counts_the_cores_the_process_may_use():
    # A process pinned to one core (taskset, a container's cpuset) competes for that
    # one, not for every core of the machine.
    code = (
        "from keras_dp_tools.capture.monitor.host_usage import HostCpuMeter; "
        "print(HostCpuMeter().read()['cpu_count'])"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        preexec_fn=pinned_to(1),
    )
    assert result.stdout.strip() == "1"


class CountingSource:
    def __init__(self, fail_after=None):
        self.reads = 0
        self.fail_after = fail_after

    def read(self):
        self.reads += 1
        if self.fail_after is not None and self.reads > self.fail_after:
            raise RuntimeError("GPU fell off the bus")
        return [{"time": time.time(), "gpu": 0, "util_gpu": 50.0}]


def test_sampler_reads_until_stopped_and_leaves_no_thread():
    received = []
    sampler = Sampler(CountingSource(), received.extend, interval=0.01)
    sampler.start()
    time.sleep(0.2)
    sampler.stop()

    assert len(received) >= 3
    assert not sampler_threads()


def test_sampler_stops_itself_when_training_goes_quiet():
    sampler = Sampler(CountingSource(), lambda readings: None, interval=0.01, idle_timeout=0.1)
    sampler.start()
    time.sleep(0.5)  # nobody calls heartbeat(): the fit died

    assert not sampler.running and not sampler_threads()
    sampler.heartbeat()
    sampler.start()  # the next step revives it
    assert sampler.running
    sampler.stop()


def test_sampler_reports_a_failing_read_once_and_stops():
    errors = []
    sampler = Sampler(CountingSource(fail_after=2), lambda r: None, 0.01, on_error=errors.append)
    sampler.start()
    time.sleep(0.3)

    assert [str(error) for error in errors] == ["GPU fell off the bus"]
    assert sampler.failed and not sampler_threads()


def test_interval_means_integrate_the_piecewise_constant_signal():
    # Reading k holds on (t[k-1], t[k]]: 10 on (0,1], 20 on (1,2], 30 on (2,3].
    times, values = [0.0, 1.0, 2.0, 3.0], [99.0, 10.0, 20.0, 30.0]
    means = interval_means(times, values, [0.5, 1.0, 2.5, 5.0, -2.0], [2.5, 1.5, 4.0, 6.0, 0.5])
    # [0.5,2.5]: 0.5*10 + 1*20 + 0.5*30 = 40 over 2 s. [2.5,4] is clipped to [2.5,3].
    assert means[:3] == pytest.approx([20.0, 20.0, 30.0])
    assert np.isnan(means[3])  # after the readings
    assert means[4] == pytest.approx(10.0)  # clipped to [0, 0.5]


def recorded_samples():
    """Two GPUs polled every 0.5 s over 4 s; GPU 1 also has a denser driver buffer."""
    rows = []
    for k in range(9):
        t = 100.0 + 0.5 * k
        rows.append(
            {
                "run": "r",
                "worker": 0,
                "gpu": 0,
                "time": t,
                "sampling": "poll",
                "util_gpu": 40.0 if t <= 102 else 80.0,
                "sm_activity": 20.0,
                "power_w": 200.0,
                "mem_used_gb": 10.0 + k,
            }
        )
        rows.append(
            {
                "run": "r",
                "worker": 0,
                "gpu": 1,
                "time": t,
                "sampling": "poll",
                "util_gpu": 0.0,
                "sm_activity": 5.0,
                "power_w": 60.0,
                "mem_used_gb": 2.0,
            }
        )
    for k in range(41):
        rows.append(
            {
                "run": "r",
                "worker": 0,
                "gpu": 1,
                "time": 100.0 + 0.1 * k,
                "sampling": "buffer",
                "util_gpu": 100.0,
            }
        )
    return pd.DataFrame(rows)


def recorded_steps():
    return pd.DataFrame(
        {
            "run": "r",
            "worker": 0,
            "step": [0, 1, 2, 3],
            "epoch": [0, 0, 1, 1],
            "time": [100.5, 101.0, 102.5, 103.0],
            "step_ms": [500.0, 500.0, 500.0, 500.0],
            "steps": [1, 1, 1, 1],
        }
    )


def test_steps_get_the_time_weighted_utilization_of_each_gpu():
    per_step = step_gpu_utilization(recorded_samples(), recorded_steps())
    table = per_step.pivot(index="step", columns="gpu", values="gpu_util")

    assert table[0].tolist() == pytest.approx([40.0, 40.0, 80.0, 80.0])
    assert table[1].tolist() == pytest.approx([100.0] * 4)  # the driver buffer wins


def test_epoch_summary_and_misleading_utilization_flag():
    summary = epoch_gpu_summary(recorded_samples(), recorded_steps()).set_index(["epoch", "gpu"])

    assert summary.loc[(0, 0), "gpu_util"] == pytest.approx(40.0)
    assert summary.loc[(1, 0), "gpu_util"] == pytest.approx(80.0)
    assert summary.loc[(1, 0), "power_w"] == pytest.approx(200.0)
    findings = utilization_findings(recorded_samples())
    assert len(findings) == 1 and "GPU 0" in findings[0] and "possibly misleading" in findings[0]
