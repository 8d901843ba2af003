"""Records of a synchronous multi-worker run, written from docs/records.md alone.

An independent generator for the cluster-scale benchmarks (issue 39): it knows only the
documented format (`header`, `step`, `fit_end`, and with ``--windows`` the `window`,
`replica_step` and `step_breakdown` records), not the test suite's writer
(tests/helpers), so a reader that leans on that writer's habits shows here.

The time model is one of synchronous training: the job's steps end together (the
gradient all-reduce waits for every replica), step ``k`` ends at ``ends[k]``. A worker
starts step ``k`` when it is done with step ``k-1`` plus its host gap, so:

* ``--late-start W:MS`` makes worker ``W`` enter every step ``MS`` later than the others
  (an input-bound straggler): the job's steps take ``MS`` longer, the other workers wait
  that long inside each step, and worker ``W``'s own ``step_ms`` is the *shortest*;
* ``--late-end W:MS`` makes worker ``W`` leave every step ``MS`` after the others (a
  slow device finishing its update late): its next step starts late, and the others
  wait for it at the next all-reduce.

    python benchmarks/records_generator.py OUT --workers 64 --steps 100000 \
        --late-start 17:12 [--windows]

writes ``OUT/keras_dp/worker-<i>.jsonl``. Times are Unix seconds from
``--start`` (fixed, so two runs write the same bytes with the same ``--seed``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

RUN = "gen-20261203-000000-39"
REPLICAS_PER_WORKER = 8


def step_times(args, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of every worker's steps, shape (workers, steps), Unix seconds."""
    workers, steps = args.workers, args.steps
    own_ms = args.step_ms * rng.lognormal(0.0, 0.05, size=steps)  # the job's step work
    own_ms[0] += args.warmup_ms  # the first call traces and compiles
    gap_ms = args.gap_ms * rng.lognormal(0.0, 0.2, size=(workers, steps))
    late_start = np.zeros(workers)
    late_end = np.zeros(workers)
    for worker, ms in args.late_start:
        late_start[worker] = ms
    for worker, ms in args.late_end:
        late_end[worker] = ms
    starts = np.empty((workers, steps))
    ends = np.empty((workers, steps))
    done = np.full(workers, args.start)  # when each worker left its previous step
    for step in range(steps):
        starts[:, step] = done + (gap_ms[:, step] + late_start) / 1e3
        # The all-reduce: no replica leaves before the last one arrived and worked.
        ends[:, step] = starts[:, step].max() + own_ms[step] / 1e3 + late_end / 1e3
        done = ends[:, step]
    return starts, ends


def header(args, worker: int) -> dict:
    return {
        "type": "header",
        "schema": 1,
        "run": RUN,
        "worker": worker,
        "time": args.start,
        "hostname": f"node-{worker:03d}",
        "pid": 1000 + worker,
        "strategy": "MultiWorkerMirroredStrategy",
        "replicas": args.workers * REPLICAS_PER_WORKER,
        "workers": args.workers,
        "devices": [f"/job:worker/replica:0/task:{worker}/device:GPU:{gpu}" for gpu in range(8)],
        "global_batch": args.global_batch,
        "global_batch_source": "dataset_shape",
        "steps_per_execution": 1,
        "keras_package": "tf_keras",
        "keras_version": "2.18.0",
        "tf_version": "2.18.0",
        "python_version": "3.11.9",
        "keras_dp_tools_version": "0.2.0",
        "embedding_layers": 0,
        "embedding_names": [],
        "run_id_source": "env",
        "cluster": "0123456789ab",
    }


def windows_of(args) -> list[tuple[int, int]]:
    """(start_step, end_step) of the profiler windows: 5 steps, three times a run."""
    if not args.windows:
        return []
    return [(step, step + 5) for step in (100, args.steps * 2 // 5, args.steps * 4 // 5)]


def window_lines(args, worker, starts, ends, start_step, end_step, index) -> list[str]:
    """A window's `open` and `analysed` records and its steps' breakdown rows."""
    opened = {
        "type": "window",
        "run": RUN,
        "worker": worker,
        "time": float(starts[worker, start_step]),
        "window": index,
        "start_step": start_step,
        "end_step": end_step,
        "status": "open",
    }
    lines = [json.dumps(opened)]
    for step in range(start_step, end_step):
        step_ms = (ends[worker, step] - starts[worker, step]) * 1e3
        wait_ms = (starts[:, step].max() - starts[worker, step]) * 1e3
        compute_ms = args.step_ms * 0.7
        allreduce_ms = args.step_ms * 0.2 + wait_ms
        rows = []
        for replica in range(REPLICAS_PER_WORKER):
            rows.append(
                {
                    "type": "replica_step",
                    "run": RUN,
                    "worker": worker,
                    "window": index,
                    "step": step,
                    "replica": worker * REPLICAS_PER_WORKER + replica,
                    "device": f"/device:GPU:{replica}",
                    "steps": 1,
                    "step_ms": step_ms,
                    "compute_ms": compute_ms,
                    "allreduce_ms": allreduce_ms,
                    "sync_wait_ms": wait_ms,
                    "transfer_ms": args.step_ms * 0.2,
                    "exposed_allreduce_ms": allreduce_ms * 0.5,
                    "input_ms": 0.0,
                    "other_ms": step_ms - compute_ms - allreduce_ms * 0.5,
                    "comm_share": allreduce_ms * 0.5 / step_ms,
                    "wait_share": wait_ms / step_ms,
                    "allreduce_bytes": 100_000_000,
                    "step_source": "kdp_marker",
                }
            )
        lines += [json.dumps(row) for row in rows]
        per_step = ("replica", "device")
        breakdown = {key: value for key, value in rows[0].items() if key not in per_step}
        breakdown.update(
            type="step_breakdown",
            replicas=REPLICAS_PER_WORKER,
            max_sync_wait_ms=wait_ms,
            straggler_replica=None,  # the generator does not model replica order
        )
        lines.append(json.dumps(breakdown))
    analysed = {
        **opened,
        "time": float(ends[worker, end_step - 1]),
        "status": "analysed",
        "steps_analysed": end_step - start_step,
        "stop_ms": 40.0,
        "analysis_end": float(ends[worker, end_step - 1]) + 2.0,
        "allreduce_bytes": 100_000_000,
        "local_replicas": REPLICAS_PER_WORKER,
        "replicas_in_sync": args.workers * REPLICAS_PER_WORKER,
        "global_batch": args.global_batch,
        "steps_per_execution": 1,
        "steps_covered": [[step, 1] for step in range(start_step, end_step)],
        "trace": f"plugins/profile/w{worker}-{index}/node-{worker:03d}.xplane.pb",
        "profile_run": f"w{worker}-{index}",
    }
    lines.append(json.dumps(analysed))
    return lines


def write_worker(args, worker: int, starts: np.ndarray, ends: np.ndarray, folder: Path) -> Path:
    path = folder / f"worker-{worker}.jsonl"
    windows = {start: (end, index) for index, (start, end) in enumerate(windows_of(args))}
    step_ms = (ends[worker] - starts[worker]) * 1e3
    per_s = args.global_batch / (step_ms / 1e3)
    epochs = np.arange(args.steps) // args.steps_per_epoch
    with path.open("w") as out:
        out.write(json.dumps(header(args, worker)) + "\n")
        lines = []
        for step in range(args.steps):
            warmup = "true" if step == 0 else "false"
            lines.append(
                f'{{"type": "step", "run": "{RUN}", "worker": {worker}, '
                f'"time": {starts[worker, step]:.6f}, "epoch": {epochs[step]}, '
                f'"step": {step}, "steps": 1, "step_ms": {step_ms[step]:.4f}, '
                f'"examples": {args.global_batch}, "examples_per_s": {per_s[step]:.2f}, '
                f'"warmup": {warmup}}}'
            )
            if step + 1 in (end for end, _ in windows.values()):
                start = next(s for s, (end, _) in windows.items() if end == step + 1)
                end, index = windows[start]
                lines += window_lines(args, worker, starts, ends, start, end, index)
            if len(lines) >= 10_000:
                out.write("\n".join(lines) + "\n")
                lines = []
        end = {
            "type": "fit_end",
            "run": RUN,
            "worker": worker,
            "time": float(ends[worker, -1]),
            "step": args.steps,
            "status": "finished",
        }
        lines.append(json.dumps(end))
        out.write("\n".join(lines) + "\n")
    return path


def worker_ms(text: str) -> tuple[int, float]:
    worker, _, ms = text.partition(":")
    return int(worker), float(ms)


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the log dir to write (OUT/keras_dp/)")
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--step-ms", type=float, default=50.0, help="the job's step work")
    parser.add_argument("--gap-ms", type=float, default=0.3, help="host time between steps")
    parser.add_argument("--warmup-ms", type=float, default=4000.0)
    parser.add_argument("--global-batch", type=int, default=4096)
    parser.add_argument("--steps-per-epoch", type=int, default=1000)
    parser.add_argument("--late-start", type=worker_ms, action="append", default=[])
    parser.add_argument("--late-end", type=worker_ms, action="append", default=[])
    parser.add_argument("--windows", action="store_true", help="profiler windows and rows")
    parser.add_argument("--start", type=float, default=1_790_000_000.0)
    parser.add_argument("--seed", type=int, default=39)
    return parser.parse_args(argv)


def main(argv=None) -> list[Path]:
    args = parse(argv)
    folder = args.out / "keras_dp"
    folder.mkdir(parents=True, exist_ok=True)
    starts, ends = step_times(args, np.random.default_rng(args.seed))
    return [write_worker(args, worker, starts, ends, folder) for worker in range(args.workers)]


if __name__ == "__main__":
    paths = main()
    print(f"{len(paths)} files, {sum(p.stat().st_size for p in paths) / 1e6:.0f} MB")
