"""Records of a made-up multi-worker run at cluster scale, byte for byte as the
callbacks write them: step lines through the ``RecordTemplate`` StepTimer uses (its
``STEP_KEYS``), every other record through ``encode_record`` (``Recorder.write``), in
the order and with the fields a real run writes (``keras-dp demo``'s records were the
model). For the ``Report.load`` benchmark at 64 workers x 100,000 steps, and at a
small size for the tests of the columnar cache.

Per worker: two headers (the profiler's callback starts the run before StepTimer adds
the global batch), a scaling plan, a ``gpu_status`` (no GPU), one step record per step
(step 0 the warm-up, ``epoch_steps`` steps per epoch), a CPU reading per second, and
per profiler window an ``open`` record, then the window's ``step_breakdown`` and
``replica_step`` rows and its outcome; a ``fit_end`` last. Every worker's clock is off
by its own ``clock_offset_ms``; all workers leave each step's all-reduce together, the
straggler enters it ``straggler_ms`` late, the others wait for it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from keras_dp_tools.capture.step_timer import STEP_KEYS
from keras_dp_tools.records.writer import (
    SCHEMA_VERSION,
    RecordTemplate,
    encode_record,
    worker_records_path,
)
from tests.helpers.recorded_runs import BALANCED, replica_row, step_row

HOST_GAP_MS = 0.5  # between a step's end and the next step's start
_WRITE_CHUNK = 1 << 22  # bytes gathered before one write


def cluster_clock_offsets_ms(workers: int, seed: int = 0, spread_ms: float = 40.0) -> np.ndarray:
    """Each worker's host clock minus worker 0's, in ms (NTP-like: tens of ms)."""
    offsets = np.random.default_rng(seed).uniform(-spread_ms, spread_ms, size=workers)
    offsets[0] = 0.0
    return offsets


def write_cluster_run(
    log_dir,
    *,
    workers: int = 64,
    steps: int = 100_000,
    run: str = "20261201-120000-c1a5e7",
    replicas_per_worker: int = 8,
    step_ms: float = 50.0,
    warmup_ms: float = 2500.0,
    epoch_steps: int = 10_000,
    windows: tuple[tuple[int, int], ...] = ((100, 105), (40_000, 40_005), (80_000, 80_005)),
    straggler: int = 5,
    straggler_ms: float = 3.0,
    profiled_ms: float = 120.0,
    analysis_steps: int = 20,
    start: float = 1.7964e9,
    seed: int = 0,
    fit_ends: bool = True,
    clock_spread_ms: float = 40.0,
) -> list[Path]:
    """Writes every worker's ``<log_dir>/keras_dp/worker-<i>.jsonl``; returns the paths.

    Step durations vary around ``step_ms`` (a fixed pseudo-random pattern per step,
    the same for all workers: they leave the all-reduce together), a worker enters
    each step up to 0.4 ms after the first one, the ``straggler`` worker
    ``straggler_ms`` later; steps in a profiler window and the ``analysis_steps``
    after it take ``profiled_ms``. Windows beyond ``steps`` are left out. Without
    ``fit_ends`` no worker writes its ``fit_end`` (a job killed, or still running);
    clocks are off by up to ``clock_spread_ms`` either way.
    """
    rng = np.random.default_rng(seed)
    windows = tuple((first, end) for first, end in windows if end <= steps)
    durations = step_ms * (1.0 + rng.uniform(-0.1, 0.2, size=steps))
    durations[0] = warmup_ms
    for first, end in windows:
        durations[first : min(end + analysis_steps, steps)] = profiled_ms
    # Worker-independent step starts (the all-reduce's end is the next step's start).
    began = start + np.concatenate([[0.0], np.cumsum(durations)]) / 1e3
    entry_ms = rng.uniform(0.0, 0.4, size=(workers, steps))
    if 0 <= straggler < workers:
        entry_ms[straggler] += straggler_ms
    entry_ms[:, 0] = 0.0  # the warm-up: each worker on its own
    offsets = cluster_clock_offsets_ms(workers, seed, clock_spread_ms)
    replicas = workers * replicas_per_worker
    global_batch = 32 * replicas
    paths = []
    for worker in range(workers):
        host = f"node-{worker:03d}"
        devices = [
            f"/job:worker/replica:0/task:{worker}/device:GPU:{gpu}"
            for gpu in range(replicas_per_worker)
        ]
        path = worker_records_path(log_dir, worker)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Host clock of this worker: entries and the shared ends, shifted by its offset.
        entered = began[:-1] + entry_ms[worker] / 1e3 + offsets[worker] / 1e3
        # All workers leave the all-reduce together, 0.5 ms of host work before the
        # next step begins.
        ends = began[1:] - HOST_GAP_MS / 1e3 + offsets[worker] / 1e3
        common = {"run": run, "worker": worker}
        # Records other than steps, by the step before whose record they are written.
        others: dict[int, list[bytes]] = {}
        for number, (first, end) in enumerate(windows):
            _window_records(
                others, common, number, first, end, entered, ends, analysis_steps, devices,
                replicas, worker, straggler, global_batch,
            )  # fmt: skip
        _cpu_samples(others, common, entered, rng)
        with open(path, "wb") as out:
            started = float(entered[0]) - 0.3  # the header: before the first step, on its clock
            for record in _run_start(common, started, host, worker, devices, replicas, workers):
                out.write(encode_record(record))
            out.write(
                encode_record(
                    {"type": "gpu_status", **common, "time": started + 0.05,
                     "gpu_available": False, "gpu_reason": "NVML is not installed (pip "
                     "install nvidia-ml-py)"}
                )
            )  # fmt: skip
            _write_steps(out, common, entered, ends, epoch_steps, global_batch, others)
            if not fit_ends:
                paths.append(path)
                continue
            out.write(
                encode_record(
                    {"type": "fit_end", **common, "time": float(ends[-1]) + 0.01,
                     "step": steps, "status": "finished"}
                )
            )  # fmt: skip
        paths.append(path)
    return paths


def _run_start(common, start, host, worker, devices, replicas, workers) -> list[dict]:
    """The records at the start of a worker's run, as Recorder and BatchScalingCheck
    write them: the header (and again with the global batch), the scaling plan."""
    header = {
        "type": "header",
        "schema": SCHEMA_VERSION,
        **common,
        "time": start,
        "hostname": host,
        "pid": 4000 + worker,
        "strategy": "MultiWorkerMirroredStrategy",
        "replicas": replicas,
        "workers": workers,
        "devices": devices,
        "global_batch": None,
        "steps_per_execution": 1,
        "keras_package": "tf_keras",
        "keras_version": "2.21.0",
        "tf_version": "2.21.0",
        "python_version": "3.11.7",
        "keras_dp_tools_version": "0.1.0",
        "embedding_layers": 0,
        "embedding_names": [],
    }
    plan = {
        "type": "scaling_plan",
        **common,
        "time": start + 0.001,
        "plan_rule": "linear",
        "plan_replicas": replicas,
        "plan_per_replica_batch": 32,
        "plan_global_batch": 32 * replicas,
        "plan_base_batch": 256,
        "plan_base_lr": 0.1,
        "plan_target_lr": 0.1 * 32 * replicas / 256,
        "plan_warmup_steps": 500,
        "plan_explanation": "the linear rule with a warm-up (Goyal et al. 2017)",
    }
    return [header, plan, {**header, "global_batch": 32 * replicas}]


def _write_steps(out, common, entered, ends, epoch_steps, global_batch, others) -> None:
    """The step records, with the ``others`` due before each step, in chunks."""
    template = RecordTemplate({"type": "step", **common}, STEP_KEYS)
    chunk: list[bytes] = []
    size = 0
    for step, (began, ended) in enumerate(zip(entered.tolist(), ends.tolist(), strict=True)):
        chunk.extend(others.get(step, ()))
        elapsed_ms = (ended - began) * 1e3
        values = (
            began,
            step // epoch_steps,
            step,
            1,
            elapsed_ms,
            global_batch,  # examples: every batch full
            global_batch / elapsed_ms * 1e3,
            step == 0,
        )
        line = template.line(values)
        if line is None:  # a value only json writes: as Recorder.write_values falls back
            line = encode_record(
                {"type": "step", **common, **dict(zip(STEP_KEYS, values, strict=True))}
            )
        chunk.append(line)
        size += len(line)
        if size >= _WRITE_CHUNK:
            out.write(b"".join(chunk))
            chunk, size = [], 0
    chunk.extend(others.get(len(entered), ()))
    out.write(b"".join(chunk))


def _window_records(
    others, common, number, first, end, entered, ends, analysis_steps, devices, replicas,
    worker, straggler, global_batch,
) -> None:  # fmt: skip
    """A window's records, as DataParallelProfiler writes them: ``open`` as the window
    starts; its breakdown rows and its outcome once the background analysis returns
    (``analysis_steps`` after the window)."""
    started = float(entered[first]) - 1e-4
    opened = {"type": "window", **common, "time": started, "window": number,
              "start_step": first, "status": "open"}  # fmt: skip
    others.setdefault(first, []).append(encode_record(opened))
    local = len(devices)
    waits = {"sync_wait_ms": 0.4, "exposed_sync_wait_ms": 0.3}
    done = min(end + analysis_steps, len(entered))
    lines = others.setdefault(done, [])
    for step in range(first, end):
        step_ms = float(ends[step] - entered[step]) * 1e3
        # The straggler's replicas waited for nobody in the all-reduce.
        rows = [
            replica_row({**BALANCED, **waits}, step_ms, replicas, waits=worker != straggler)
            for replica in range(local)
        ]
        for replica, row in enumerate(rows):
            lines.append(
                encode_record(
                    {"type": "replica_step", **common, "time": started, "window": number,
                     "step": step, "replica": replica, "device": devices[replica],
                     **row, "bandwidth_note": None}
                )
            )  # fmt: skip
        lines.append(
            encode_record(
                {"type": "step_breakdown", **common, "time": started, "window": number,
                 "step": step, "replicas": local, **step_row(rows, replicas),
                 "straggler_replica": 0, "bandwidth_note": None}
            )
        )  # fmt: skip
    analysis_end = float(entered[done - 1]) + 0.01
    lines.append(
        encode_record(
            {"type": "window", **common, "time": started, "window": number,
             "start_step": first, "end_step": end, "stop_ms": 41.5, "local_replicas": local,
             "replicas_in_sync": replicas, "devices": devices, "global_batch": global_batch,
             "steps_per_execution": 1, "allreduce_bytes": BALANCED["allreduce_bytes"],
             "sparse_bytes": None, "gather_bytes": None,
             "steps_covered": [[step, 1] for step in range(first, end)],
             "trace": f"train/plugins/profile/w{number}/{common['worker']}.xplane.pb",
             "profile_run": f"w{number}", "analysis_end": analysis_end, "attribution": None,
             "status": "analysed", "reason": None, "steps_analysed": end - first}
        )
    )  # fmt: skip


def _cpu_samples(others, common, entered, rng) -> None:
    """GpuMonitor's CPU readings on a machine without GPUs: about one a second, written
    on the training thread between steps."""
    times = np.arange(entered[0] + 1.0, entered[-1], 1.0)
    due = np.searchsorted(entered, times)  # the first step that began after the reading
    process = rng.uniform(95.0, 140.0, size=len(times)).tolist()
    system = rng.uniform(40.0, 70.0, size=len(times)).tolist()
    for step, time, ours, machine in zip(due.tolist(), times.tolist(), process, system,
                                         strict=True):  # fmt: skip
        others.setdefault(step, []).append(
            encode_record(
                {
                    "type": "cpu_sample",
                    **common,
                    "time": time,
                    "process_cpu_percent": ours,
                    "system_cpu_percent": machine,
                    "cpu_count": 96,
                }
            )
        )
