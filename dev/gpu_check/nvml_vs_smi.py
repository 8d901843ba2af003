"""Step ``nvml_vs_smi``: the NVML readings GpuMonitor records next to ``nvidia-smi
--query-gpu`` taken right after each, while a TensorFlow matmul loop loads the GPU
(when TensorFlow is installed; otherwise idle, and the report says so). Needs neither
TensorFlow nor pandas itself."""

from __future__ import annotations

import csv
import importlib.util
import subprocess
import sys
import time

from dev.gpu_check.results import finding, step_parser, write_result
from dev.gpu_check.tolerances import NVML_VS_SMI

# Matmuls on /gpu:0 until killed; "ready" once the first one ran.
_LOAD = (
    "import tensorflow as tf\n"
    "a = tf.random.uniform((8192, 8192))\n"
    "with tf.device('/gpu:0'):\n"
    "    tf.linalg.matmul(a, a).numpy(); print('ready', flush=True)\n"
    "    while True:\n"
    "        for _ in range(20): b = tf.linalg.matmul(a, a)\n"
    "        b.numpy()\n"
)


def start_load(wait_s: float = 45.0) -> tuple[subprocess.Popen | None, str]:
    if importlib.util.find_spec("tensorflow") is None:
        return None, "no load: TensorFlow is absent, so utilization and power are compared idle"
    load = subprocess.Popen(
        [sys.executable, "-c", _LOAD], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and load.poll() is None:
        if load.stdout.readline().strip() == "ready":
            return load, "under load: an 8192x8192 matmul loop on /gpu:0"
    load.kill()
    return (
        None,
        f"no load: the matmul loop did not start within {wait_s:.0f} s (exit {load.poll()})",
    )


def sample(seconds: float, interval: float) -> tuple[list, list[dict]]:
    """(devices, rows): one row per GPU and moment, ours and nvidia-smi's."""
    from keras_dp_tools.capture.monitor.nvml_reader import NvmlReader
    from keras_dp_tools.tools.doctor import bus_key, nvidia_smi_readings

    reader = NvmlReader(high_rate=False)
    devices = reader.open()
    rows = []
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            moment = time.time()
            ours = {r["gpu"]: r for r in reader.read() if r.get("sampling", "poll") == "poll"}
            theirs = nvidia_smi_readings()
            for device in devices:
                smi = theirs.get(bus_key(device.pci_bus_id), {})
                row = {"time": round(moment, 3), "gpu": device.gpu}
                for name in NVML_VS_SMI:
                    row[f"nvml_{name}"] = ours.get(device.gpu, {}).get(name)
                    row[f"smi_{name}"] = smi.get(name)
                rows.append(row)
            time.sleep(interval)
    finally:
        reader.close()
    return devices, rows


def compare(devices, rows: list[dict]) -> tuple[list[dict], list[str]]:
    findings, notes = [], []
    for device in devices:
        mine = [row for row in rows if row["gpu"] == device.gpu]
        for name, tolerance in NVML_VS_SMI.items():
            pairs = [
                (row[f"nvml_{name}"], row[f"smi_{name}"])
                for row in mine
                if row[f"nvml_{name}"] is not None and row[f"smi_{name}"] is not None
            ]
            check = f"GPU {device.gpu} {name}, mean of {len(pairs)} pairs"
            if not pairs:
                findings.append(finding(check, None, None, tolerance))
                continue
            ours = sum(a for a, _ in pairs) / len(pairs)
            smi = sum(b for _, b in pairs) / len(pairs)
            findings.append(finding(check, ours, smi, tolerance))
            notes.append(
                f"GPU {device.gpu} {name}: largest single-pair difference "
                f"{max(abs(a - b) for a, b in pairs):.3g}"
            )
    return findings, notes


def main(argv: list[str] | None = None) -> int:
    parser = step_parser(__doc__)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--interval", type=float, default=0.25)
    args = parser.parse_args(argv)
    if args.dry_run:
        print(
            f"would start a matmul load, then pair NVML and nvidia-smi readings every "
            f"{args.interval} s for {args.seconds} s; tolerances {NVML_VS_SMI}"
        )
        write_result(args.out, {"status": "dry-run", "summary": "plan printed"})
        return 0
    from keras_dp_tools.capture.monitor.nvml_reader import NvmlUnavailable

    load, load_note = start_load()
    try:
        devices, rows = sample(args.seconds, args.interval)
    except (NvmlUnavailable, OSError, subprocess.SubprocessError) as error:
        write_result(
            args.out,
            {"status": "failed", "summary": f"cannot sample: {type(error).__name__}: {error}"},
        )
        return 0
    finally:
        if load is not None:
            load.kill()
    if rows:
        with open(args.out / "samples.csv", "w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    findings, notes = compare(devices, rows)
    write_result(
        args.out,
        {
            "status": "ok" if rows else "failed",
            "summary": f"{len(rows)} paired readings over {args.seconds:.0f} s, {load_note}",
            "findings": findings,
            "notes": [load_note, "raw pairs: samples.csv", *notes],
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
