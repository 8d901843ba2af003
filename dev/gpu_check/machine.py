"""Is there a GPU here, and what the report says about the machine. Standard library
(and ``pynvml`` if installed) only."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys

# Set by the tests: on a GPU machine they must take the no-GPU path, not start a check.
HIDE_GPUS_ENV = "KDT_GPU_CHECK_HIDE_GPUS"


def gpu_names() -> tuple[list[str], str]:
    """The GPUs ``nvidia-smi -L`` (else NVML) lists, and why none when empty."""
    if os.environ.get(HIDE_GPUS_ENV):
        return [], f"GPUs hidden by {HIDE_GPUS_ENV}"
    if shutil.which("nvidia-smi"):
        try:
            listed = subprocess.run(
                ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True
            ).stdout
        except (OSError, subprocess.SubprocessError) as error:
            return [], f"nvidia-smi -L failed ({type(error).__name__}: {error})"
        names = [line.strip() for line in listed.splitlines() if line.startswith("GPU ")]
        return names, "" if names else "nvidia-smi lists no GPU"
    try:
        import pynvml as nvml

        nvml.nvmlInit()
    except Exception as error:  # ImportError, NVMLError_*: no driver here
        return [], f"no nvidia-smi on PATH and NVML unavailable ({type(error).__name__})"
    try:
        count = nvml.nvmlDeviceGetCount()
        names = [
            str(nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(index)))
            for index in range(count)
        ]
    finally:
        nvml.nvmlShutdown()
    return names, "" if names else "NVML counts no GPU"


def facts(names: list[str]) -> dict[str, str]:
    return {
        "host": platform.node(),
        "system": f"{platform.system()} {platform.release()} {platform.machine()}",
        "python": f"{platform.python_version()} ({sys.executable})",
        "CPUs": str(os.cpu_count()),
        "GPUs": "; ".join(names) or "none",
    }


def main() -> int:
    """Exit 0 when a GPU is here; else print why not in one line and exit 1 (the
    Makefile's test before it makes a virtual environment)."""
    names, why_none = gpu_names()
    if names:
        return 0
    print(f"no GPU: {why_none}; nothing to check (--dry-run shows what would run)")
    return 1


if __name__ == "__main__":
    sys.exit(main())
