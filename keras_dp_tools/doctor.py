"""``keras-dp doctor``: what the toolkit can see on this machine.

Prints, section by section: the devices TensorFlow sees (or that it is absent), NVML's
versions and what each GPU supports (GPM, NVLink), a few NVML readings next to
``nvidia-smi``'s, and whether the profiler can record device activity (CUPTI). Every
check runs on its own: a failing one says why and the others go on. Needs neither
TensorFlow nor pandas (they are imported only inside their checks).

Example:

```python
from keras_dp_tools import doctor

print(doctor.format_report(doctor.collect(profile=False)))
```
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# (title, [(name, value), ...]) per section.
Section = tuple[str, list[tuple[str, str]]]
_SMI_FIELDS = (
    "pci.bus_id",
    "utilization.gpu",
    "memory.used",
    "power.draw",
    "clocks.sm",
    "temperature.gpu",
)
# Our reading field, its unit factor from nvidia-smi's unit (MiB -> GiB for memory).
_SMI_TO_READING = {
    "utilization.gpu": ("util_gpu", 1.0),
    "memory.used": ("mem_used_gb", 1 / 1024),
    "power.draw": ("power_w", 1.0),
    "clocks.sm": ("sm_clock_mhz", 1.0),
    "temperature.gpu": ("temperature_c", 1.0),
}


def _failure(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}".strip()


def tensorflow_section() -> tuple[Section, object]:
    """TensorFlow's version, CUDA build, and devices; also returns the module or None."""
    rows = [("python", f"{platform.python_version()} ({sys.executable})")]
    rows.append(("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES", "(not set)")))
    try:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        import tensorflow as tf
    except ImportError as error:
        rows.append(("tensorflow", f"absent ({error}); the NVML checks below still run"))
        return ("TensorFlow", rows), None
    rows.append(("tensorflow", tf.__version__))
    try:
        rows.append(("built with CUDA", str(tf.test.is_built_with_cuda())))
        build = tf.sysconfig.get_build_info()
        rows.append(("CUDA / cuDNN", f"{build.get('cuda_version')} / {build.get('cudnn_version')}"))
        physical = tf.config.list_physical_devices("GPU")
        visible = tf.config.get_visible_devices("GPU")
        rows.append(("physical GPUs", ", ".join(d.name for d in physical) or "none"))
        if len(visible) != len(physical):
            rows.append(
                (
                    "visible GPUs",
                    f"{', '.join(d.name for d in visible) or 'none'} (set_visible_devices: "
                    "TF's GPU ids then differ from the CUDA ordinals traces are named by)",
                )
            )
        for gpu in visible:
            details = tf.config.experimental.get_device_details(gpu)
            rows.append((gpu.name, ", ".join(f"{k}={v}" for k, v in sorted(details.items()))))
        logical = tf.config.list_logical_devices()
        rows.append(("logical devices", ", ".join(d.name for d in logical)))
    except Exception as error:  # a broken install is what doctor is for
        rows.append(("devices", f"could not list: {_failure(error)}"))
    return ("TensorFlow", rows), tf


def nvml_section() -> tuple[Section, list[dict]]:
    """NVML's versions, each GPU's GPM / NVLink support and one reading per GPU."""
    from keras_dp_tools.monitor.nvml_reader import NvmlReader, NvmlUnavailable

    rows: list[tuple[str, str]] = []
    reader = NvmlReader(high_rate=False)
    try:
        devices = reader.open()
    except NvmlUnavailable as reason:
        return ("NVML", [("status", f"unavailable: {reason}")]), []
    import pynvml as nvml  # opened by the reader: importable

    try:
        for name, call in [
            ("driver", "nvmlSystemGetDriverVersion"),
            ("NVML version", "nvmlSystemGetNVMLVersion"),
        ]:
            try:
                rows.append((name, str(_text(getattr(nvml, call)()))))
            except (nvml.NVMLError, AttributeError) as error:
                rows.append((name, f"unknown ({_failure(error)})"))
        readings = [r for r in reader.read() if r.get("sampling") == "poll"]
        for device, reading in zip(devices, readings, strict=True):
            rows.append(
                (
                    f"GPU {device.nvml_index}",
                    f"{device.name}, {device.pci_bus_id}, {device.uuid}; GPM "
                    f"{'supported' if device.gpm else 'not supported'}; NVLink "
                    f"{_nvlink_links(nvml, device.handle)}",
                )
            )
            rows.append((f"GPU {device.nvml_index} NVML", _format_reading(reading)))
        for reading, device in zip(readings, devices, strict=True):
            reading["pci_bus_id"] = device.pci_bus_id
    finally:
        reader.close()
    return ("NVML", rows), readings


def _text(value):
    return value.decode() if isinstance(value, bytes) else value


def _nvlink_links(nvml, handle) -> str:
    """Active NVLink links of a GPU ("none" on PCIe-only GPUs)."""
    active = 0
    for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            active += bool(nvml.nvmlDeviceGetNvLinkState(handle, link))
        except nvml.NVMLError_NotSupported:
            return "not supported"
        except nvml.NVMLError:
            break  # past the GPU's last link
    return f"{active} active link(s)" if active else "none active"


def _format_reading(reading: dict) -> str:
    units = {
        "util_gpu": "% util",
        "mem_used_gb": " GiB used",
        "power_w": " W",
        "sm_clock_mhz": " MHz SM",
        "temperature_c": " C",
    }
    parts = []
    for name, unit in units.items():
        value = reading.get(name)
        parts.append(f"{value:.1f}{unit}" if value is not None else f"n/a{unit}")
    return ", ".join(parts)


def nvidia_smi_section(readings: list[dict]) -> Section:
    """nvidia-smi's numbers for the same GPUs, and how far ours are from them."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ("nvidia-smi", [("status", "not found on PATH")])
    query = f"--query-gpu={','.join(_SMI_FIELDS)}"
    try:
        result = subprocess.run(
            [smi, query, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return ("nvidia-smi", [("status", f"failed: {_failure(error)}")])
    if result.returncode != 0:
        return ("nvidia-smi", [("status", f"exit {result.returncode}: {result.stderr.strip()}")])
    ours = {_bus_key(r["pci_bus_id"]): r for r in readings if r.get("pci_bus_id")}
    rows = []
    for line in result.stdout.strip().splitlines():
        values = dict(zip(_SMI_FIELDS, (v.strip() for v in line.split(",")), strict=False))
        bus_id = values.get("pci.bus_id", "?")
        reading = ours.get(_bus_key(bus_id), {})
        cells = []
        for field, (name, factor) in _SMI_TO_READING.items():
            smi_value = _number(values.get(field))
            nvml_value = reading.get(name)
            smi_text = "n/a" if smi_value is None else f"{smi_value * factor:.1f}"
            nvml_text = "n/a" if nvml_value is None else f"{nvml_value:.1f}"
            cells.append(f"{name} smi {smi_text} / nvml {nvml_text}")
        rows.append((bus_id, "; ".join(cells)))
    rows.append(("note", "utilization and power move between the two reads: compare roughly"))
    return ("nvidia-smi", rows)


def _bus_key(bus_id: str) -> str:
    # nvidia-smi prints 00000000:1B:00.0, TensorFlow 0000:1b:00.0: compare the tail.
    return bus_id.lower().split(":", 1)[-1] if bus_id.count(":") == 2 else bus_id.lower()


def _number(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def cupti_libraries() -> list[str]:
    """Where a CUPTI library is found: the loader's search, CUDA installs, pip wheels."""
    found = []
    name = ctypes.util.find_library("cupti")
    if name:
        found.append(name)
    patterns = ["/usr/local/cuda*/extras/CUPTI/lib64/libcupti.so*", "/usr/lib/*/libcupti.so*"]
    for entry in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep):
        if entry:
            patterns.append(os.path.join(entry, "libcupti.so*"))
    for site in sys.path:
        patterns.append(os.path.join(site, "nvidia", "cuda_cupti", "lib", "libcupti.so*"))
    for pattern in patterns:
        found.extend(sorted(glob.glob(pattern)))
    return list(dict.fromkeys(found))


def cupti_section(tf, profile: bool) -> Section:
    """Whether CUPTI loads, and (``profile``) whether a tiny profiled op on the first
    GPU leaves a GPU plane with device events."""
    rows = []
    libraries = cupti_libraries()
    loadable = None
    for library in libraries:
        try:
            ctypes.CDLL(library)
        except OSError as error:
            rows.append(("libcupti", f"{library}: not loadable ({error})"))
        else:
            loadable = library
            break
    rows.append(("libcupti", loadable or "not found (TensorFlow records no GPU activity)"))
    if not profile:
        rows.append(("device tracing", "not tried (--no-profile)"))
    elif tf is None:
        rows.append(("device tracing", "not tried: TensorFlow is absent"))
    elif not tf.config.get_visible_devices("GPU"):
        rows.append(("device tracing", "not tried: no GPU visible to TensorFlow"))
    else:
        rows.append(("device tracing", _profile_one_op(tf)))
    return ("Profiler (CUPTI)", rows)


def _profile_one_op(tf) -> str:
    from keras_dp_tools.analysis.gpu_trace import stream_events
    from keras_dp_tools.analysis.xspace import find_traces, gpu_planes, load_xspace

    with tempfile.TemporaryDirectory(prefix="keras_dp_doctor_") as directory:
        try:
            tf.profiler.experimental.start(directory)
            try:
                with tf.device("/gpu:0"):
                    matrix = tf.random.uniform((256, 256))
                    tf.linalg.matmul(matrix, matrix).numpy()
            finally:
                tf.profiler.experimental.stop()
            space = load_xspace(find_traces(Path(directory))[-1])
        except Exception as error:
            return f"failed: {_failure(error)}"
        planes = gpu_planes(space)
        counts = {ordinal: len(stream_events(plane)) for ordinal, plane in planes.items()}
    if not any(counts.values()):
        return (
            f"no device events recorded (GPU planes: {sorted(counts) or 'none'}): CUPTI is "
            "not working here, so profiler windows would be marked failed"
        )
    listed = ", ".join(f"GPU:{o} {n} event(s)" for o, n in counts.items())
    return f"works: a matmul on /gpu:0 left {listed}"


def collect(profile: bool = True) -> list[Section]:
    """All sections, each check isolated from the others' failures."""
    tf_section, tf = tensorflow_section()
    sections = [tf_section]
    try:
        nvml, readings = nvml_section()
    except Exception as error:
        nvml, readings = ("NVML", [("status", f"check failed: {_failure(error)}")]), []
    sections += [nvml, nvidia_smi_section(readings)]
    try:
        sections.append(cupti_section(tf, profile))
    except Exception as error:
        sections.append(("Profiler (CUPTI)", [("status", f"check failed: {_failure(error)}")]))
    return sections


def format_report(sections: list[Section]) -> str:
    lines = []
    for title, rows in sections:
        lines.append(title)
        width = max((len(name) for name, _ in rows), default=0)
        lines.extend(f"  {name.ljust(width)}  {value}" for name, value in rows)
        lines.append("")
    return "\n".join(lines)


def run_doctor(profile: bool = True) -> int:
    print(format_report(collect(profile=profile)), flush=True)
    return 0
