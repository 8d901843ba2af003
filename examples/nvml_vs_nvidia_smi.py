"""Compare keras_dp_tools' NVML readings with nvidia-smi's, side by side, on a GPU machine.

Needs only Python, nvidia-ml-py and nvidia-smi (no TensorFlow, no pandas). Run it while
something uses the GPUs (e.g. `make demo` in another shell) to compare utilization too:

    python examples/nvml_vs_nvidia_smi.py --seconds 20 --interval 0.5

For each GPU it prints the mean of both sources per quantity and their largest
difference. Exit status: 0 when they agree within the tolerances, 1 when not, 2 when
there is no NVML or nvidia-smi to compare.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

# The checkout's own package, and the GPU check's tolerances (dev/gpu_check/, a developer
# tool the package does not ship) next to it.
CHECKOUT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(CHECKOUT))

from dev.gpu_check.tolerances import (  # noqa: E402
    NVML_VS_SMI as TOLERANCES,  # the same tolerances make gpu-check holds them to
)
from keras_dp_tools.capture.monitor.nvml_reader import NvmlReader, NvmlUnavailable  # noqa: E402
from keras_dp_tools.tools.doctor import bus_key, nvidia_smi_readings  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="how long to compare (10)")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between readings")
    args = parser.parse_args(argv)

    reader = NvmlReader(high_rate=False)
    try:
        devices = reader.open()
    except NvmlUnavailable as reason:
        print(f"No NVML here: {reason}", file=sys.stderr)
        return 2
    if shutil.which("nvidia-smi") is None:
        reader.close()
        print("nvidia-smi is not on PATH: nothing to compare with.", file=sys.stderr)
        return 2
    bus_ids = [bus_key(device.pci_bus_id) for device in devices]
    pairs = {device.gpu: [] for device in devices}
    deadline = time.monotonic() + args.seconds
    count = 0
    try:
        while time.monotonic() < deadline:
            ours = {reading["gpu"]: reading for reading in reader.read()}
            theirs = nvidia_smi_readings()
            for device, bus_id in zip(devices, bus_ids, strict=True):
                pairs[device.gpu].append((ours[device.gpu], theirs.get(bus_id, {})))
            count += 1
            print(f"\rreading {count} ({args.seconds:.0f} s)", end="", file=sys.stderr, flush=True)
            time.sleep(args.interval)
    finally:
        reader.close()
    print(file=sys.stderr)

    agree = True
    for device in devices:
        print(f"GPU {device.gpu} ({device.name}, {device.pci_bus_id}):")
        print(f"  {'quantity':<14}{'ours':>10}{'nvidia-smi':>12}{'max diff':>10}  ok")
        for name, tolerance in TOLERANCES.items():
            both = [
                (ours.get(name), theirs.get(name))
                for ours, theirs in pairs[device.gpu]
                if ours.get(name) is not None and theirs.get(name) is not None
            ]
            if not both:
                print(f"  {name:<14}{'n/a':>10}{'n/a':>12}")
                continue
            mean_ours = sum(a for a, _ in both) / len(both)
            mean_smi = sum(b for _, b in both) / len(both)
            worst = max(abs(a - b) for a, b in both)
            ok = abs(mean_ours - mean_smi) <= tolerance
            agree &= ok
            verdict = "yes" if ok else "NO"
            print(f"  {name:<14}{mean_ours:>10.2f}{mean_smi:>12.2f}{worst:>10.2f}  {verdict}")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
