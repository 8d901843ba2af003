"""Writes the records of made-up runs, in the format the callbacks write, for tests of
the records, the report, the advisor, the dashboard and the plots (no TensorFlow needed).

``header`` and ``step`` make single records; ``write_records`` writes a list of them;
``write_run`` writes a whole single-worker run (``write_windowed_multiworker_run`` a
multi-worker one), every file through the package's own ``RecordWriter``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from keras_dp_tools.records.writer import SCHEMA_VERSION, RecordWriter, worker_records_path


def header(run="r1", worker=0, **fields) -> dict:
    """A run header with only the fields every header has, and ``fields``."""
    return {"type": "header", "schema": SCHEMA_VERSION, "run": run, "worker": worker, **fields}


def step(step, run="r1", worker=0, **fields) -> dict:
    """A step record of ``10 + step`` ms (step 0 the warm-up), with ``fields`` on top."""
    record = {
        "type": "step",
        "run": run,
        "worker": worker,
        "epoch": 0,
        "step": step,
        "steps": 1,
        "step_ms": 10.0 + step,
        "warmup": step == 0,
    }
    return {**record, **fields}


def write_records(path, records) -> Path:
    """Writes ``records`` to the records file ``path`` (appending, as the writer does)."""
    writer = RecordWriter(path)
    for record in records:
        writer.write(record)
    writer.close()
    return Path(path)


def write_gpu_samples(writer, common: dict, times, gpu_util: float) -> None:
    """Polled NVML readings of two GPUs at ``gpu_util`` percent, one pair per time."""
    for time in times:
        for gpu in (0, 1):
            writer.write(
                {"type": "gpu_sample", **common, "gpu": gpu, "sampling": "poll", "time": time,
                 "util_gpu": gpu_util}
            )  # fmt: skip


def step_durations(step_ms, steps: int | None) -> list[float]:
    """``step_ms`` as one duration per step: a number for every step, a sequence (its
    length the number of steps), or a function of the step number."""
    if isinstance(step_ms, Sequence):
        if steps is not None and steps != len(step_ms):
            raise ValueError(f"steps={steps} but {len(step_ms)} step durations were given")
        return [float(ms) for ms in step_ms]
    steps = 30 if steps is None else steps
    if callable(step_ms):
        return [float(step_ms(index)) for index in range(steps)]
    return [float(step_ms)] * steps


def write_run(
    log_dir,
    run="r1",
    worker=0,
    step_ms=10.0,
    *,
    steps=None,
    replicas=4,
    global_batch=64,
    start=1000.0,
    step_seconds=None,
    header_fields=None,
    profiled=range(10, 15),
    breakdown=None,
    stragglers=None,
    gpu_util=None,
    batching=(),
    embedding_layers=0,
    embedding_names=None,
) -> Path:
    """One worker's records of a run; returns the file's path.

    A header (``header_fields`` add to it or replace its fields; a field given as None
    is left out, as are ``global_batch`` and the throughput when it is None), step
    records of ``step_ms`` (see ``step_durations``; 30 steps unless ``steps`` or a
    sequence says otherwise; the first a warm-up), step k's time ``start`` plus the
    steps before it (or plus ``k * step_seconds``), then with a ``breakdown`` a profiler
    window over ``profiled`` with the breakdown fields on every profiled step
    (``stragglers``: the straggler replica per profiled step), GPU readings at
    ``gpu_util`` percent for two GPUs, and the ``batching`` findings (severity, code)."""
    durations = step_durations(step_ms, steps)
    steps = len(durations)
    if (breakdown is not None or gpu_util is not None) and len(set(durations)) > 1:
        raise ValueError(f"a breakdown or GPU readings need one step_ms for every step: {step_ms}")
    fields = {
        "time": start,
        "strategy": "MirroredStrategy",
        "replicas": replicas,
        "workers": 1,
        "global_batch": global_batch,
        "embedding_layers": embedding_layers,
        "embedding_names": embedding_names,
        **(header_fields or {}),
    }
    fields = {name: value for name, value in fields.items() if value is not None}
    path = worker_records_path(log_dir, worker)
    writer = RecordWriter(path)
    common = {"run": run, "worker": worker}
    writer.write(header(**common, **fields))
    elapsed = 0.0
    for index, ms in enumerate(durations):
        time = start + (elapsed / 1e3 if step_seconds is None else index * step_seconds)
        elapsed += ms
        throughput = {} if global_batch is None else {"examples_per_s": global_batch / ms * 1e3}
        writer.write(step(index, **common, time=time, step_ms=ms, **throughput))
    step_ms = durations[0] if durations else 0.0  # the breakdown's scale and times
    profiled = list(profiled)
    if breakdown is not None and profiled:
        writer.write(
            {
                "type": "window",
                **common,
                "time": start + profiled[0] * step_ms / 1e3,
                "window": 0,
                "start_step": profiled[0],
                "end_step": profiled[-1] + 1,
                "status": "analysed",
                "steps_analysed": len(profiled),
                "trace": "train/plugins/profile/x/h.xplane.pb",
                "profile_run": "x",
            }
        )
        for position, index in enumerate(profiled):
            straggler = None if stragglers is None else stragglers[position]
            rows = [
                replica_row(breakdown, step_ms, replicas, waits=replica != straggler)
                for replica in range(replicas)
            ]
            for replica, row in enumerate(rows):
                writer.write(
                    {
                        "type": "replica_step",
                        **common,
                        "time": start,
                        "window": 0,
                        "step": index,
                        "replica": replica,
                        **row,
                    }
                )
            writer.write(
                {
                    "type": "step_breakdown",
                    **common,
                    "time": start,
                    "window": 0,
                    "step": index,
                    "replicas": replicas,
                    "straggler_replica": straggler,
                    **step_row(rows, replicas),
                }
            )
    if gpu_util is not None:
        times = [start + index * step_ms / 1e3 for index in range(steps + 1)]
        write_gpu_samples(writer, common, times, gpu_util)
    for severity, code in batching:
        writer.write(
            {
                "type": "batching_finding",
                **common,
                "time": start,
                "severity": severity,
                "code": code,
                "message": f"{code} happened.",
                "fix": "Fix it.",
            }
        )
    writer.close()
    return path


def write_scaling_runs(log_dir):
    """Runs "one" (1 replica, batch 64, 10 ms steps) and "four" (4 replicas, batch 256,
    20 ms steps, communication-heavy): 4x the batch in 2x the time, so twice the
    throughput of one replica, a scaling efficiency of 50%."""
    write_run(log_dir / "n1", run="one", replicas=1, step_ms=10.0, global_batch=64)
    write_run(
        log_dir / "n4",
        run="four",
        replicas=4,
        step_ms=20.0,
        global_batch=256,
        breakdown=COMM_HEAVY,
        start=2000.0,
    )


def replica_row(base: dict, step_ms: float, ranks: int, waits: bool = True) -> dict:
    """A replica's breakdown for a step of ``step_ms`` from ``base`` (ms per 10 ms step:
    compute, all-reduce and its exposed part, sync wait and its exposed part, input,
    bytes), scaled to the step, with every derived column following the analyzer's
    rules (docs/breakdown.md): transfer = all-reduce - wait, other = the rest of the
    step, split half dispatch, 30% idle, 20% scheduling; shares over the step;
    bandwidths from bytes over transfer time. ``waits=False``: the replica that
    arrived last, which waited for nobody."""
    scale = step_ms / 10.0
    ms = {name: value * scale for name, value in base.items() if name.endswith("_ms")}
    wait = ms["sync_wait_ms"] if waits else 0.0
    exposed_wait = ms["exposed_sync_wait_ms"] if waits else 0.0
    other = step_ms - ms["compute_ms"] - ms["exposed_allreduce_ms"] - ms["input_ms"]
    row = {
        "steps": 1,
        "step_ms": step_ms,
        "compute_ms": ms["compute_ms"],
        "allreduce_ms": ms["allreduce_ms"],
        "sync_wait_ms": wait,
        "transfer_ms": ms["allreduce_ms"] - wait,
        "gather_ms": ms.get("gather_ms", 0.0),
        "gather_transfer_ms": ms.get("gather_ms", 0.0),
        "exposed_allreduce_ms": ms["exposed_allreduce_ms"],
        "exposed_sync_wait_ms": exposed_wait,
        "exposed_transfer_ms": ms["exposed_allreduce_ms"] - exposed_wait,
        "input_ms": ms["input_ms"],
        "other_ms": other,
        "dispatch_ms": 0.5 * other,
        "idle_ms": 0.3 * other,
        "scheduling_ms": other - 0.5 * other - 0.3 * other,
    }
    row["comm_share"] = row["exposed_transfer_ms"] / step_ms
    row["wait_share"] = row["exposed_sync_wait_ms"] / step_ms
    return {**row, **_bytes(row, base.get("allreduce_bytes"), ranks, base.get("gather_bytes"))}


def step_row(rows: list[dict], ranks: int) -> dict:
    """The step's row as the analyzer makes it: times averaged over replicas, the
    longest wait, bandwidth from the bytes and the mean transfer time."""
    means = {
        name: sum(row[name] for row in rows) / len(rows)
        for name in rows[0]
        if name.endswith(("_ms", "_share"))
    }
    step = {**means, "steps": 1, "max_sync_wait_ms": max(row["sync_wait_ms"] for row in rows)}
    return {**step, **_bytes(step, rows[0]["allreduce_bytes"], ranks, rows[0]["gather_bytes"])}


def _bytes(row: dict, allreduce_bytes, ranks: int, gather_bytes=None) -> dict:
    """nccl-tests' bandwidths: all-reduce busbw = bytes / transfer * 2(n-1)/n, all-gather
    busbw = bytes / transfer * (n-1)/n, each over its own transfer time."""
    result = {"allreduce_bytes": allreduce_bytes, "gather_bytes": gather_bytes}
    result["row_bytes"] = ((allreduce_bytes or 0) + (gather_bytes or 0)) * row["steps"] or None
    if allreduce_bytes:
        algbw = allreduce_bytes / ((row["transfer_ms"] - row["gather_transfer_ms"]) / 1e3) / 1e9
        result["algbw_gbps"] = algbw
        result["busbw_gbps"] = algbw * 2 * (ranks - 1) / ranks
    if gather_bytes:
        algbw = gather_bytes / (row["gather_transfer_ms"] / 1e3) / 1e9
        result["gather_busbw_gbps"] = algbw * (ranks - 1) / ranks
    return result


# Breakdowns (ms per 10 ms step; replica_row derives the rest).
COMM_HEAVY = {
    "compute_ms": 4.0,
    "allreduce_ms": 5.0,
    "sync_wait_ms": 0.5,
    "exposed_allreduce_ms": 4.0,
    "exposed_sync_wait_ms": 0.5,
    "input_ms": 0.5,
    "allreduce_bytes": 40_000_000,
}
BALANCED = {
    "compute_ms": 8.0,
    "allreduce_ms": 1.0,
    "sync_wait_ms": 0.2,
    "exposed_allreduce_ms": 0.5,
    "exposed_sync_wait_ms": 0.1,
    "input_ms": 0.2,
    "allreduce_bytes": 4_000_000,
}
WAITING = {
    **BALANCED,
    "compute_ms": 5.6,
    "allreduce_ms": 3.5,
    "sync_wait_ms": 3.0,
    "exposed_allreduce_ms": 3.0,
    "exposed_sync_wait_ms": 2.5,
}
INPUT_BOUND = {**BALANCED, "compute_ms": 6.0, "input_ms": 2.5}
# An Embedding's gradients all-gathered: 1.5 of the 2.5 ms of communication per 10 ms.
SPARSE = {
    **BALANCED,
    "compute_ms": 6.0,
    "allreduce_ms": 2.5,
    "exposed_allreduce_ms": 2.0,
    "gather_ms": 1.5,
    "allreduce_bytes": 260,
    "gather_bytes": 83_200,
}
# Little compute or communication: most of the step is host time.
HOST_BOUND = {**BALANCED, "compute_ms": 3.0}


def write_windowed_multiworker_run(
    log_dir,
    run="mw",
    workers=2,
    replicas_per_worker=2,
    steps=240,
    windows=((10, 15), (110, 115), (210, 215)),
    step_ms=10.0,
    warmup_ms=220.0,
    profiled_ms=30.0,
    analysis_steps=3,
    breakdown=BALANCED,
    gpu_util=None,
    start=1000.0,
):
    """One run on ``workers`` workers, each profiled in every window of ``windows``
    (``[start_step, end_step)``) as a multi-worker job with ``profile_workers="all"``
    records it: step 0 is a warm-up of ``warmup_ms``; steps inside a window and the
    ``analysis_steps`` after it (the analysis runs in the background) take
    ``profiled_ms``; the others ``step_ms``. Replica r of worker w is the straggler (no
    wait) in every profiled step when r == w % replicas_per_worker. With ``gpu_util``,
    two GPUs per worker read that percent; without, a gpu_status record says why not.
    Worker w's replicas that wait wait (1 + w) / 2 times ``breakdown``'s sync wait (and
    its exposed part); ``replica_row`` derives the other columns."""
    replicas = workers * replicas_per_worker
    global_batch = 16 * replicas
    slow = {
        step for first, end in windows for step in range(first, min(end + analysis_steps, steps))
    }
    # Steady steps vary by up to 20% (a fixed pattern), as real ones do.
    durations = [
        warmup_ms if step == 0 else profiled_ms if step in slow else step_ms * (1 + step % 5 / 20)
        for step in range(steps)
    ]
    began = [start + sum(durations[:step]) / 1e3 for step in range(steps + 1)]
    for worker in range(workers):
        writer = RecordWriter(worker_records_path(log_dir, worker))
        common = {"run": run, "worker": worker}
        writer.write(
            {
                "type": "header",
                "schema": SCHEMA_VERSION,
                **common,
                "time": start,
                "strategy": "MultiWorkerMirroredStrategy",
                "replicas": replicas,
                "workers": workers,
                "global_batch": global_batch,
            }
        )
        if gpu_util is None:
            writer.write(
                {
                    "type": "gpu_status",
                    **common,
                    "time": start,
                    "gpu_available": False,
                    "gpu_reason": "the strategy uses no GPU (devices: /cpu:0, /cpu:1)",
                }
            )
        for step in range(steps):
            writer.write(
                {
                    "type": "step",
                    **common,
                    "time": began[step],  # the train call's entry, as StepTimer writes
                    "epoch": 0,
                    "step": step,
                    "steps": 1,
                    "step_ms": durations[step],
                    "examples_per_s": global_batch / durations[step] * 1e3,
                    "warmup": step == 0,
                }
            )
        straggler = worker % replicas_per_worker
        for number, (first, end) in enumerate(windows):
            writer.write(
                {
                    "type": "window",
                    **common,
                    "time": began[first] + 1e-6,  # just after step first-1 ended
                    "window": number,
                    "start_step": first,
                    "end_step": end,
                    "status": "analysed",
                    "steps_analysed": end - first,
                    # during the last of its steps: before the next one starts
                    "analysis_end": began[min(end + analysis_steps, steps)] - 1e-6,
                    "trace": f"train/plugins/profile/w{number}/h{worker}.xplane.pb",
                    "profile_run": f"w{number}",
                }
            )
            waits = {
                name: breakdown[name] * (1 + worker) / 2
                for name in ("sync_wait_ms", "exposed_sync_wait_ms")
            }
            rows = [
                replica_row({**breakdown, **waits}, step_ms, replicas, replica != straggler)
                for replica in range(replicas_per_worker)
            ]
            for step in range(first, end):
                writer.write(
                    {
                        "type": "step_breakdown",
                        **common,
                        "time": began[end],
                        "window": number,
                        "step": step,
                        "replicas": replicas_per_worker,
                        "straggler_replica": straggler,
                        **step_row(rows, replicas),
                    }
                )
                for replica, row in enumerate(rows):
                    writer.write(
                        {
                            "type": "replica_step",
                            **common,
                            "time": began[end],
                            "window": number,
                            "step": step,
                            "replica": replica,
                            **row,
                        }
                    )
        if gpu_util is not None:
            write_gpu_samples(writer, common, [began[step] for step in range(steps + 1)], gpu_util)
        writer.close()
