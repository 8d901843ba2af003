"""Running a training script once per replica count and comparing the runs.

Each run gets ``KERAS_DP_REPLICAS=N`` (``kdt.configure_devices`` and the demo honour it:
N GPUs, or the CPU split into N devices), ``CUDA_VISIBLE_DEVICES`` set to the first N
visible GPUs where there are GPUs, and ``KERAS_DP_LOG_DIR=<sweep dir>/replicas-<N>``.
``{replicas}`` and ``{log_dir}`` in the script's arguments are replaced too. Without
GPUs the replicas are logical devices of one CPU, sharing its cores: the sweep says so.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from keras_dp_tools.records.contract import LOG_DIR_ENV, REPLICAS_ENV, RUN_ID_ENV


def gpu_ids() -> list[str]:
    """The GPUs a child process may use: CUDA_VISIBLE_DEVICES entries, else NVML's."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [entry.strip() for entry in visible.split(",") if entry.strip()]
    from keras_dp_tools.capture.monitor.nvml_reader import NvmlReader, NvmlUnavailable

    reader = NvmlReader(high_rate=False)
    try:
        devices = reader.open()
    except NvmlUnavailable:
        return []
    reader.close()
    return [str(device.nvml_index) for device in devices]


def command_for(script: str, arguments: Sequence[str]) -> list[str]:
    """``python SCRIPT ARGS``, or the demo for ``script == "demo"``."""
    if script == "demo":
        return [sys.executable, "-m", "keras_dp_tools", "demo", *arguments]
    if not Path(script).is_file():
        raise FileNotFoundError(f"No such script: {script} (or use 'demo').")
    return [sys.executable, script, *arguments]


def run_sweep(
    script: str,
    replicas: Sequence[int],
    log_dir: str | os.PathLike,
    arguments: Sequence[str] = (),
    progress: Callable[[str], None] = print,
    timeout: float | None = None,
):
    """Runs ``script`` once per replica count into ``log_dir/replicas-<N>``
    (``keras-dp sweep``).

    Args:
        script: the training script; ``{replicas}`` and ``{log_dir}`` in ``arguments``
            are filled in for each run.
        replicas: the replica counts to run.
        log_dir: the sweep's folder.
        arguments: the script's arguments.
        progress: called with a line per run.
        timeout: seconds a run may take (None: no limit).

    Returns:
        The ``Report`` of all runs.

    Raises:
        ValueError: more replicas than visible GPUs.
        RuntimeError: a run failed (with the run's output tail), after keeping what the
            earlier runs recorded.

    Example:

    ```python
    from keras_dp_tools.tools.sweep import run_sweep

    report = run_sweep("train.py", [1, 2, 4], "runs/sweep", ["--log-dir", "{log_dir}"])
    print(report.compare())
    ```
    """
    from keras_dp_tools.report.facade import Report

    log_dir = Path(log_dir)
    gpus = gpu_ids()
    if gpus and max(replicas) > len(gpus):
        raise ValueError(f"--replicas asks for {max(replicas)} GPUs; {len(gpus)} are visible.")
    if not gpus:
        progress(
            f"No GPUs: each run splits the CPU into N logical devices that share its "
            f"{os.cpu_count()} cores, so adding replicas adds no compute: read the scaling "
            "as a rehearsal of the setup, not a measurement of it."
        )
    for number, count in enumerate(replicas, 1):
        run_dir = log_dir / f"replicas-{count}"
        run_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, REPLICAS_ENV: str(count), LOG_DIR_ENV: str(run_dir)}
        env.pop(RUN_ID_ENV, None)  # each run its own id
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[:count])
        substituted = [a.format(replicas=count, log_dir=run_dir) for a in arguments]
        command = command_for(script, substituted)
        progress(f"[{number}/{len(replicas)}] {count} replica(s): {' '.join(command[1:])}")
        started = time.monotonic()
        output_path = run_dir / "output.log"
        with open(output_path, "w", encoding="utf-8") as output:
            result = subprocess.run(
                command, stdout=output, stderr=subprocess.STDOUT, env=env, timeout=timeout
            )
        elapsed = time.monotonic() - started
        if result.returncode != 0:
            tail = output_path.read_text(encoding="utf-8", errors="replace")[-2000:]
            raise RuntimeError(
                f"the run with {count} replica(s) failed (exit {result.returncode}); its "
                f"output is in {output_path}:\n{tail}"
            )
        progress(f"      done in {elapsed:.0f} s, output in {output_path}")
    return Report.load(log_dir)
