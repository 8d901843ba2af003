"""``keras-dp doctor``: what the toolkit can see on this machine.

Prints, section by section: the devices TensorFlow sees (or that it is absent), NVML's
versions and what each GPU supports (GPM, NVLink), a few NVML readings next to
``nvidia-smi``'s, and whether the profiler can record device activity (CUPTI). Every
check runs on its own: a failing one says why and the others go on. Needs neither
TensorFlow nor pandas (they are imported only inside their checks).

Example:

```python
from keras_dp_tools.tools import doctor

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
# Our reading field -> (nvidia-smi query field, factor from smi's unit to ours).
SMI_QUANTITIES = {
    "util_gpu": ("utilization.gpu", 1.0),
    "util_memory": ("utilization.memory", 1.0),
    "mem_used_gb": ("memory.used", 1 / 1024),  # MiB -> GiB
    "mem_total_gb": ("memory.total", 1 / 1024),
    "power_w": ("power.draw", 1.0),
    "sm_clock_mhz": ("clocks.sm", 1.0),
    "temperature_c": ("temperature.gpu", 1.0),
}
_SHOWN = ("util_gpu", "mem_used_gb", "power_w", "sm_clock_mhz", "temperature_c")


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
    from keras_dp_tools.capture.monitor.nvml_reader import NvmlReader, NvmlUnavailable

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


def nvidia_smi_readings() -> dict[str, dict[str, float | None]]:
    """One ``nvidia-smi`` reading per GPU in our fields and units (``SMI_QUANTITIES``),
    keyed by ``bus_key`` of its PCI bus id; None where it prints ``[N/A]``.

    Raises:
        OSError, subprocess.SubprocessError: nvidia-smi is missing or failed.
    """
    fields = ["pci.bus_id", *(field for field, _ in SMI_QUANTITIES.values())]
    output = subprocess.run(
        ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    readings = {}
    for line in output.strip().splitlines():
        bus_id, *values = (value.strip() for value in line.split(","))
        readings[bus_key(bus_id)] = {
            name: None if _number(value) is None else _number(value) * factor
            for (name, (_, factor)), value in zip(SMI_QUANTITIES.items(), values, strict=True)
        }
    return readings


def nvidia_smi_section(readings: list[dict]) -> Section:
    """nvidia-smi's numbers for the same GPUs next to NVML's."""
    if shutil.which("nvidia-smi") is None:
        return ("nvidia-smi", [("status", "not found on PATH")])
    try:
        theirs = nvidia_smi_readings()
    except (OSError, subprocess.SubprocessError) as error:
        return ("nvidia-smi", [("status", f"failed: {_failure(error)}")])
    ours = {bus_key(r["pci_bus_id"]): r for r in readings if r.get("pci_bus_id")}
    rows = []
    for key, smi in theirs.items():
        reading = ours.get(key, {})
        cells = [
            f"{name} smi {_shown(smi.get(name))} / nvml {_shown(reading.get(name))}"
            for name in _SHOWN
        ]
        rows.append((key, "; ".join(cells)))
    rows.append(("note", "utilization and power move between the two reads: compare roughly"))
    return ("nvidia-smi", rows)


def _shown(value) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def bus_key(bus_id: str) -> str:
    """A PCI bus id in one spelling: nvidia-smi and NVML print ``00000000:1B:00.0``,
    TensorFlow ``0000:1b:00.0``."""
    domain, _, rest = bus_id.strip().lower().partition(":")
    try:
        return f"{int(domain, 16):08x}:{rest}"
    except ValueError:  # not a PCI bus id: compare as given
        return bus_id.strip().lower()


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
    from keras_dp_tools.analysis.breakdown.gpu_trace import stream_events
    from keras_dp_tools.analysis.trace.xspace import find_traces, gpu_planes, load_xspace

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
    """The doctor's sections as text: each title, then its rows, names aligned.

    Args:
        sections: ``collect()``'s ``(title, [(name, value), ...])`` pairs.

    Returns:
        The text, ending with an empty line.

    Example:

    >>> from keras_dp_tools.tools.doctor import format_report
    >>> print(format_report([("NVML", [("version", "12.535"), ("GPUs", "0")])]))
    NVML
      version  12.535
      GPUs     0
    <BLANKLINE>
    """
    lines = []
    for title, rows in sections:
        lines.append(title)
        width = max((len(name) for name, _ in rows), default=0)
        lines.extend(f"  {name.ljust(width)}  {value}" for name, value in rows)
        lines.append("")
    return "\n".join(lines)


def check_failures(sections: list[Section], profile: bool = True) -> list[str]:
    """The checks a working GPU machine passes (``keras-dp doctor --check``): TensorFlow
    imports, is built with CUDA and sees a GPU; NVML opens; nvidia-smi answers; a CUPTI
    library loads; and (``profile``) the profiled matmul leaves device events. Returns
    one line per failed check."""
    found = {title: dict(rows) for title, rows in sections}
    tf_rows = found.get("TensorFlow", {})
    nvml = found.get("NVML", {}).get("status", "")
    smi = found.get("nvidia-smi", {}).get("status")
    cupti = found.get("Profiler (CUPTI)", {})
    checks = [
        ("TensorFlow imports", not tf_rows.get("tensorflow", "absent").startswith("absent")),
        ("TensorFlow is built with CUDA", tf_rows.get("built with CUDA") == "True"),
        ("TensorFlow sees a GPU", tf_rows.get("physical GPUs", "none") != "none"),
        ("NVML opens", not nvml.startswith(("unavailable", "check failed"))),
        ("nvidia-smi answers", smi is None),
        ("a CUPTI library loads", not cupti.get("libcupti", "not found").startswith("not found")),
    ]
    if profile:
        tracing = cupti.get("device tracing", "not tried")
        checks.append(("the profiled matmul leaves device events", tracing.startswith("works")))
    return [name for name, passed in checks if not passed]


def run_doctor(profile: bool = True, check: bool = False) -> int:
    """Prints what the toolkit can see on this machine (``keras-dp doctor``).

    Args:
        profile: also trace a matmul on the first GPU with the profiler.
        check: also print the failed checks (``--check``).

    Returns:
        The exit status: 1 with ``check`` when a check failed, else 0.

    Example:

    ```python
    from keras_dp_tools.tools.doctor import run_doctor

    run_doctor(profile=False)  # TensorFlow, NVML, nvidia-smi and CUPTI sections
    ```
    """
    sections = collect(profile=profile)
    print(format_report(sections), flush=True)
    if not check:
        return 0
    failed = check_failures(sections, profile)
    print(f"check: {'FAILED: ' + '; '.join(failed) if failed else 'every check passed'}")
    return 1 if failed else 0
