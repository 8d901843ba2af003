"""``keras-dp doctor``: runs without TensorFlow, and reports NVML's view of the GPUs."""

import subprocess
import sys

import pynvml

from keras_dp_tools.tools import doctor
from tests.helpers import REPO
from tests.helpers.nvml_fake import FakeGpu, fake_pynvml

BLOCKED_RUN = (
    "import sys\n"
    "sys.modules['tensorflow'] = None  # import tensorflow now raises ImportError\n"
    "sys.modules['pandas'] = None\n"
    "from keras_dp_tools.tools.cli import main\n"
    "sys.exit(main(['doctor']))\n"
)


def test_doctor_runs_without_tensorflow():
    result = subprocess.run(
        [sys.executable, "-c", BLOCKED_RUN], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert "tensorflow" in out and "absent" in out
    assert "NVML" in out and "nvidia-smi" in out
    assert "device tracing  not tried: TensorFlow is absent" in out


def test_doctor_reports_gpm_nvlink_and_readings_from_nvml(monkeypatch):
    gpus = [
        FakeGpu(nvlink_active=(1, 1, 1, 0), unsupported={"power"}),
        FakeGpu(gpm=False, bus_id="00000000:2C:00.0", uuid="GPU-b", nvlink_kib=[(0, 0)]),
    ]
    gpus[1].unsupported = {"nvlink_state"}
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(gpus))
    (title, rows), readings = doctor.nvml_section()
    values = dict(rows)

    assert title == "NVML" and values["NVML version"] == "12.570.86"
    assert "GPM supported; NVLink 3 active link(s)" in values["GPU 0"]
    assert "GPM not supported; NVLink not supported" in values["GPU 1"]
    assert values["GPU 0 NVML"] == "87.0% util, 20.0 GiB used, n/a W, 1980.0 MHz SM, 63.0 C"
    assert [r["pci_bus_id"] for r in readings] == ["00000000:1B:00.0", "00000000:2C:00.0"]


def test_doctor_without_nvml_or_nvidia_smi_says_so(monkeypatch, tmp_path, tf):
    # tf: the session fixture splits the CPU before doctor lists (and so fixes) devices
    def no_library():
        raise pynvml.NVMLError_LibraryNotFound()

    module = fake_pynvml([])
    module.nvmlInit = no_library
    monkeypatch.setitem(sys.modules, "pynvml", module)
    monkeypatch.setenv("PATH", str(tmp_path))
    sections = dict(doctor.collect(profile=False))
    assert "NVML could not start" in dict(sections["NVML"])["status"]
    assert dict(sections["nvidia-smi"])["status"] == "not found on PATH"
    assert dict(sections["Profiler (CUPTI)"])["device tracing"] == "not tried (--no-profile)"


def test_device_tracing_is_not_tried_without_a_visible_gpu(tf):
    rows = dict(doctor.cupti_section(tf, profile=True)[1])
    assert rows["device tracing"] == "not tried: no GPU visible to TensorFlow"


def test_smi_and_tensorflow_bus_ids_meet():
    assert doctor.bus_key("00000000:1B:00.0") == doctor.bus_key("0000:1b:00.0")


def test_nvidia_smi_csv_is_read_in_our_units(monkeypatch, tmp_path):
    """The lines `nvidia-smi --query-gpu=... --format=csv,noheader,nounits` prints:
    memory in MiB (20480 MiB = 20 GiB), power in W, "[N/A]" where unsupported."""
    script = tmp_path / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        "echo '00000000:1B:00.0, 87, 41, 20480, 81559, 312.50, 1980, 63'\n"
        "echo '00000000:2C:00.0, 0, 0, 512, 81559, [N/A], 345, 30'\n"
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    readings = doctor.nvidia_smi_readings()
    first = readings[doctor.bus_key("0000:1b:00.0")]
    assert first["util_gpu"] == 87.0 and first["mem_used_gb"] == 20.0
    assert first["mem_total_gb"] == 81559 / 1024 and first["power_w"] == 312.5
    assert readings[doctor.bus_key("00000000:2C:00.0")]["power_w"] is None
