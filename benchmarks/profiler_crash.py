"""Does profiling every worker of a two-worker job crash one? Runs N jobs one after another.

Each run is ``keras-dp launch --workers 2`` of ``tests/jobs/train_job.py`` with every
worker profiling one small window (tf_keras, MultiWorkerMirroredStrategy on localhost),
in its own folder (the cwd: with the kernel's ``core_pattern`` of ``core`` a crashed
worker's core dump lands there). Workers run with ``PYTHONFAULTHANDLER=1`` (Python
stacks of all threads on SIGABRT / SIGSEGV) and an unlimited core size. For a run where
a worker died of a signal, ``gdb -batch -ex "thread apply all bt"`` on its core is
saved next to it (``gdb.txt``) and the core is deleted (they are large) unless
``--keep-cores``.

One JSON line per run goes to ``<out>/runs.jsonl``: the launcher's status, each
worker's exit (``keras-dp launch``'s ``launcher.jsonl``), which worker crashed, the
crashed worker's output tail and its faulthandler / gdb stack summary. A summary per
variant is printed at the end (and with ``--summary`` alone, for runs already made).

    nohup python benchmarks/profiler_crash.py --runs 18 --variant baseline \\
        --out /tmp/profcrash > /tmp/profcrash/baseline.log 2>&1 &

Variants (job options, see ``VARIANTS``): ``baseline`` profiles every worker the way
``DataParallelProfiler(all_workers=True)`` does; the others are the mitigations tried
(docs/multiworker.md has the counts). Results: docs/multiworker.md.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import resource
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.helpers.processes import worker_env  # noqa: E402 (shared with the tests)
from tests.helpers.split_events import complete_params_threads  # noqa: E402

JOB = REPO / "tests" / "jobs" / "train_job.py"
MULTIHOST_JOB = REPO / "tests" / "jobs" / "multihost_capture.py"
# One epoch of 12 steps, one window of 5 steps from step 3: every worker profiles the
# same steps, and the window closes mid-epoch (as it would in a user's run).
JOB_ARGS = ["--epochs", "1", "--steps-per-epoch", "12", "--profile-start-step", "3"]
VARIANTS = {
    # DataParallelProfiler(all_workers=True) as it was: start/stop in the step hooks.
    "baseline": ["--all-workers"],
    # A tiny all-reduce of every worker right before stop(): no step collective in flight.
    "barrier": ["--all-workers", "--stop-barrier"],
    # Only the host tracer, at its lowest level: no Python tracer, no device tracer.
    "host1": ["--all-workers", "--profiler-options", "1,0,0"],
    # The library's default, whatever it is (all workers once made so).
    "default": [],
    # Baseline with 40 steps: the window's analysis runs beside 30 more training steps.
    "long": ["--all-workers", "--steps-per-epoch", "40", "--profile-start-step", "5"],
    "long-barrier": [
        *("--all-workers", "--stop-barrier", "--steps-per-epoch", "40"),
        *("--profile-start-step", "5"),
    ],
    # As examples/multiworker_fit.py, where the crashes were seen: 2 epochs of 5 steps,
    # the window (steps 3-7) spans the epoch's end; GpuMonitor on.
    "epochs": ["--all-workers", "--epochs", "2", "--steps-per-epoch", "5", "--monitor"],
    "epochs-barrier": [
        *("--all-workers", "--stop-barrier", "--epochs", "2", "--steps-per-epoch", "5"),
        "--monitor",
    ],
    # 2 epochs of 6 steps with a validation of 2 batches after each: the window
    # (steps 3-7) spans the first evaluation (new collective instances, resolved then).
    "validation": [
        *("--all-workers", "--epochs", "2", "--steps-per-epoch", "6"),
        *("--validation-steps", "2"),
    ],
    # The earlier experiment's job (tests/jobs/multihost_capture.py, in-process mode).
    "multihost": None,
    # Its other mode: a profiler server per worker, one client.trace of both from a thread
    # of worker 0 (the client only asks; each worker's own server stops its session).
    "server": None,
}
FATAL = re.compile(r"Fatal Python error|free\(\)|double free|corrupt|Segmentation|Aborted")


def run_once(out: Path, variant: str, index: int, keep_cores: bool, timeout: float) -> dict:
    folder = out / variant / f"run-{index:03d}"
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    log_dir = folder / "logs"
    env = worker_env(PYTHONPATH=str(REPO))
    command = [sys.executable, "-m", "keras_dp_tools", "launch", "--workers", "2"]
    command += ["--grace", "5", "--log-dir", str(log_dir), "--"]
    if VARIANTS[variant] is None:
        mode = "server" if variant == "server" else "inprocess"
        port = str(random.randrange(20000, 60000, 2))  # the workers' servers: port, port + 1
        command += [sys.executable, str(MULTIHOST_JOB), mode, str(log_dir), port]
    else:
        command += [sys.executable, str(JOB), str(log_dir), *JOB_ARGS, *VARIANTS[variant]]
    started = time.time()
    try:
        result = subprocess.run(
            command,
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=_unlimited_cores,
        )
        output, status = result.stdout + result.stderr, result.returncode
    except subprocess.TimeoutExpired as error:
        output = (error.stdout or b"").decode(errors="replace") if error.stdout else ""
        status = "timeout"
    (folder / "output.txt").write_text(output)
    exits = _worker_exits(log_dir)
    crashed = [worker for worker, code in exits.items() if code is not None and code < 0]
    crashed = [w for w in crashed if "stopped by the launcher" not in _reason(log_dir, w)]
    record = {
        "variant": variant,
        "run": index,
        "seconds": round(time.time() - started, 1),
        "launcher_status": status,
        "worker_exits": exits,
        "crashed": crashed,
        "windows": _window_statuses(log_dir),
    }
    record["complete_params_threads"] = {
        _worker(capture): dict(kinds) for capture, kinds in complete_params_threads(log_dir).items()
    }
    if crashed or status != 0:
        worker = crashed[0] if crashed else None
        lines = _worker_lines(output, worker)
        record["output_tail"] = lines[-40:]
        record["python_stack"] = _faulthandler_summary(lines)
        cores = sorted(folder.glob("core*"))
        record["cores"] = [core.name for core in cores]
        for core in cores:
            record["gdb"] = _gdb_summary(core, folder / f"gdb-{core.name}.txt")
            if not keep_cores:
                core.unlink()
    return record


def _unlimited_cores() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def _launcher_records(log_dir: Path) -> list[dict]:
    path = log_dir / "keras_dp" / "launcher.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _worker_exits(log_dir: Path) -> dict[int, int | None]:
    return {r["worker"]: r["exit_code"] for r in _launcher_records(log_dir)}


def _reason(log_dir: Path, worker: int) -> str:
    return next((r["reason"] for r in _launcher_records(log_dir) if r["worker"] == worker), "")


def _window_statuses(log_dir: Path) -> dict[str, list[str]]:
    statuses: dict[str, list[str]] = {}
    for path in (log_dir / "keras_dp").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if row.get("type") == "window" and row.get("status") != "open":
                statuses.setdefault(str(row.get("worker", path.stem)), []).append(row["status"])
    return statuses


def _worker_lines(output: str, worker: int | None) -> list[str]:
    prefix = f"[worker {worker}] "
    lines = output.splitlines()
    if worker is None:
        return lines
    return [line.removeprefix(prefix) for line in lines if line.startswith(prefix)]


def _faulthandler_summary(lines: list[str]) -> list[str]:
    """From the first fatal line on: the error and the first frames of each thread."""
    start = next((i for i, line in enumerate(lines) if FATAL.search(line)), None)
    if start is None:
        return []
    kept, frames = [], 0
    for line in lines[start:]:
        if line.startswith(("Thread ", "Current thread ", "Fatal", "Extension")):
            kept.append(line)
            frames = 0
        elif line.strip().startswith("File ") and frames < 6:
            kept.append(line)
            frames += 1
        elif FATAL.search(line):
            kept.append(line)
    return kept[:80]


def _gdb_summary(core: Path, saved: Path) -> list[str]:
    """``thread apply all bt`` of the core, saved; returned: the crashing thread's top."""
    try:
        result = subprocess.run(
            ["gdb", "-batch", "-ex", "thread apply all bt 25", sys.executable, str(core)],
            capture_output=True,
            text=True,
            timeout=600,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return [f"gdb failed: {error}"]
    saved.write_text(result.stdout + result.stderr)
    # gdb prints the thread that got the signal first, as "Thread 1 (...)".
    blocks = re.split(r"\n(?=Thread \d+ )", result.stdout)
    first = next((block for block in blocks if block.startswith("Thread 1 ")), "")
    return [line[:200] for line in first.splitlines()[:26]]


def summarise(out: Path) -> None:
    path = out / "runs.jsonl"
    if not path.exists():
        print(f"no runs in {out}")
        return
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    by_variant: dict[str, list[dict]] = {}
    for row in rows:
        by_variant.setdefault(row["variant"], []).append(row)
    for variant, runs in by_variant.items():
        failed = [r for r in runs if r["crashed"] or r["launcher_status"] != 0]
        who = Counter(w for r in failed for w in r["crashed"])
        seconds = sorted(r["seconds"] for r in runs)
        print(
            f"{variant}: {len(runs) - len(failed)}/{len(runs)} runs ok; failed runs: "
            f"{[r['run'] for r in failed]}, crashed workers {dict(who)}, "
            f"median {seconds[len(seconds) // 2]} s a run"
        )
        for r in failed:
            print(f"  run {r['run']}: status {r['launcher_status']}, exits {r['worker_exits']}")
        exposure: dict[str, Counter] = {}
        for r in runs:
            if "complete_params_threads" not in r:  # a run recorded before this count
                folder = out / variant / f"run-{r['run']:03d}" / "logs"
                r["complete_params_threads"] = complete_params_threads(folder)
            for capture, kinds in r["complete_params_threads"].items():
                worker = _worker(capture)
                exposure.setdefault(worker, Counter()).update(kinds)
        for worker, kinds in sorted(exposure.items()):
            print(f"  worker {worker}: CompleteParams events by thread kind {dict(kinds)}")
        # Both workers run the same collectives: what worker 0's capture holds, worker 1's
        # should too. Fewer: merges of split events that went through a stale pointer.
        lost = [_lost_merges(r["complete_params_threads"]) for r in runs]
        lost = [count for count in lost if count is not None]
        if lost:
            print(
                f"  worker 1 captures missing CompleteParams events: {sum(n > 0 for n in lost)}"
                f" of {len(lost)} (missing per capture: {lost})"
            )


def _worker(capture: str) -> str:
    """The worker of a capture: ``complete_params_threads`` names the DataParallelProfiler's
    by worker, a server capture by its file, ``<host>_<port>``; the ``server`` variant's
    workers listen on an even port (worker 0) and the next one."""
    host, _, port = capture.rpartition("_")
    return str(int(port) % 2) if host and port.isdigit() else capture


def _lost_merges(threads: dict[str, dict[str, int]]) -> int | None:
    """Worker 0's CompleteParams events less worker 1's, where both have a capture."""
    counts = {_worker(capture): sum(kinds.values()) for capture, kinds in threads.items()}
    if set(counts) != {"0", "1"}:
        return None
    return counts["0"] - counts["1"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="results folder")
    parser.add_argument("--runs", type=int, default=0, help="runs to make (sequentially)")
    parser.add_argument("--variant", choices=sorted(VARIANTS), default="baseline")
    parser.add_argument("--first", type=int, default=None, help="index of the first run")
    parser.add_argument("--keep-cores", action="store_true")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds per run")
    parser.add_argument("--summary", action="store_true", help="only summarise --out")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.summary:
        first = args.first
        if first is None:
            done = list((args.out / args.variant).glob("run-*"))
            first = len(done)
        for index in range(first, first + args.runs):
            record = run_once(args.out, args.variant, index, args.keep_cores, args.timeout)
            with open(args.out / "runs.jsonl", "a") as file:
                file.write(json.dumps(record) + "\n")
            state = "CRASH" if record["crashed"] or record["launcher_status"] != 0 else "ok"
            print(
                f"{time.strftime('%H:%M:%S')} {args.variant} run {index}: {state} "
                f"exits {record['worker_exits']} windows {record['windows']} "
                f"({record['seconds']} s)",
                flush=True,
            )
    summarise(args.out)


if __name__ == "__main__":
    main()
