"""Writes the records of made-up runs, in the format the callbacks write, for tests of
the report, the advisor and the plots (no TensorFlow needed)."""

from __future__ import annotations

from keras_dp_tools.records import SCHEMA_VERSION, RecordWriter, worker_records_path


def write_run(
    log_dir,
    run="r1",
    replicas=4,
    steps=30,
    step_ms=10.0,
    global_batch=64,
    profiled=range(10, 15),
    breakdown=None,
    stragglers=None,
    gpu_util=None,
    batching=(),
    start=1000.0,
    embedding_layers=0,
):
    """One single-worker run: a header, ``steps`` step records of ``step_ms`` (the first
    a warm-up), a profiler window over ``profiled`` with the ``breakdown`` fields on
    every profiled step (``stragglers``: the straggler replica per profiled step), GPU
    readings at ``gpu_util`` percent for two GPUs, and batching findings."""
    writer = RecordWriter(worker_records_path(log_dir, 0))
    common = {"run": run, "worker": 0}
    writer.write(
        {
            "type": "header",
            "schema": SCHEMA_VERSION,
            **common,
            "time": start,
            "strategy": "MirroredStrategy",
            "replicas": replicas,
            "workers": 1,
            "global_batch": global_batch,
            "embedding_layers": embedding_layers,
        }
    )
    for index in range(steps):
        writer.write(
            {
                "type": "step",
                **common,
                "time": start + index * step_ms / 1e3,
                "epoch": 0,
                "step": index,
                "steps": 1,
                "step_ms": step_ms,
                "examples_per_s": global_batch / step_ms * 1e3,
                "warmup": index == 0,
            }
        )
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
            writer.write(
                {
                    "type": "step_breakdown",
                    **common,
                    "time": start,
                    "window": 0,
                    "step": index,
                    "step_ms": step_ms,
                    "replicas": replicas,
                    "straggler_replica": straggler,
                    **breakdown,
                }
            )
            for replica in range(replicas):
                wait = 0.0 if replica == straggler else breakdown.get("sync_wait_ms", 0.0)
                writer.write(
                    {
                        "type": "replica_step",
                        **common,
                        "time": start,
                        "window": 0,
                        "step": index,
                        "replica": replica,
                        "step_ms": step_ms,
                        **{**breakdown, "sync_wait_ms": wait},
                    }
                )
    if gpu_util is not None:
        for index in range(steps + 1):
            for gpu in (0, 1):
                writer.write(
                    {
                        "type": "gpu_sample",
                        **common,
                        "gpu": gpu,
                        "sampling": "poll",
                        "time": start + index * step_ms / 1e3,
                        "util_gpu": gpu_util,
                    }
                )
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


# Breakdowns (ms per 10 ms step) that add up to the step.
COMM_HEAVY = {
    "compute_ms": 4.0,
    "allreduce_ms": 5.0,
    "sync_wait_ms": 0.5,
    "transfer_ms": 4.5,
    "exposed_allreduce_ms": 4.0,
    "exposed_sync_wait_ms": 0.5,
    "exposed_transfer_ms": 3.5,
    "input_ms": 0.5,
    "other_ms": 1.5,
    "comm_share": 0.35,
    "wait_share": 0.05,
    "max_sync_wait_ms": 0.5,
    "allreduce_bytes": 40_000_000,
    "busbw_gbps": 12.0,
}
BALANCED = {
    "compute_ms": 8.0,
    "allreduce_ms": 1.0,
    "sync_wait_ms": 0.2,
    "transfer_ms": 0.8,
    "exposed_allreduce_ms": 0.5,
    "exposed_sync_wait_ms": 0.1,
    "exposed_transfer_ms": 0.4,
    "input_ms": 0.2,
    "other_ms": 1.3,
    "comm_share": 0.04,
    "wait_share": 0.01,
    "max_sync_wait_ms": 0.2,
    "allreduce_bytes": 4_000_000,
    "busbw_gbps": 20.0,
}
WAITING = {
    **BALANCED,
    "sync_wait_ms": 3.0,
    "exposed_sync_wait_ms": 2.5,
    "wait_share": 0.25,
    "max_sync_wait_ms": 3.5,
    "compute_ms": 5.6,
}
INPUT_BOUND = {**BALANCED, "compute_ms": 6.0, "input_ms": 2.5, "other_ms": 1.0}


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
    Worker w's replicas that wait wait (1 + w) times ``breakdown["sync_wait_ms"]``."""
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
                    "time": began[step + 1],
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
                    "analysis_end": began[min(end + analysis_steps, steps)],
                    "trace": f"train/plugins/profile/w{number}/h{worker}.xplane.pb",
                    "profile_run": f"w{number}",
                }
            )
            for step in range(first, end):
                writer.write(
                    {
                        "type": "step_breakdown",
                        **common,
                        "time": began[end],
                        "window": number,
                        "step": step,
                        "step_ms": step_ms,
                        "replicas": replicas_per_worker,
                        "straggler_replica": straggler,
                        **breakdown,
                    }
                )
                for replica in range(replicas_per_worker):
                    wait = 0.0 if replica == straggler else breakdown["sync_wait_ms"] * (1 + worker)
                    writer.write(
                        {
                            "type": "replica_step",
                            **common,
                            "time": began[end],
                            "window": number,
                            "step": step,
                            "replica": replica,
                            "step_ms": step_ms,
                            **{**breakdown, "sync_wait_ms": wait},
                        }
                    )
        if gpu_util is not None:
            for step in range(steps + 1):
                for gpu in (0, 1):
                    writer.write(
                        {
                            "type": "gpu_sample",
                            **common,
                            "gpu": gpu,
                            "sampling": "poll",
                            "time": began[step],
                            "util_gpu": gpu_util,
                        }
                    )
        writer.close()
