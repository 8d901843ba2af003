"""Report.load at cluster scale on records the tests did not write (issue 39).

Generates records with benchmarks/records_generator.py (from docs/records.md alone: step
records only, and a variant with profiler windows and replica rows), then in a fresh
process per measurement runs ``Report.load`` + ``summary()`` + ``advice()`` +
``workers`` and reports the process's CPU time and peak RSS **including the imports**,
first uncached (the JSON Lines are parsed and the columnar cache written) and then
cached, and whether the late worker is named.

    python benchmarks/cluster_scale.py OUT [--workers 64] [--steps 100000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import records_generator  # noqa: E402

GOAL = {"cpu_s": 10.0, "peak_rss_mb": 2000.0}
LATE_WORKER, LATE_MS = 17, 12.0

_CHILD = """
import json, os, resource, sys, time
wall = time.perf_counter()
sys.path.insert(0, sys.argv[2])
from keras_dp_tools.report.facade import Report

report = Report.load(sys.argv[1])
summary = report.summary()
advice = report.advice()
workers = report.workers
usage = resource.getrusage(resource.RUSAGE_SELF)
late = int(sys.argv[3])
share = workers.set_index("worker")["last_to_enter_share"]
print(json.dumps({
    "cpu_s": usage.ru_utime + usage.ru_stime,
    "wall_s": time.perf_counter() - wall,
    "peak_rss_mb": usage.ru_maxrss / 1024,
    "load_average": os.getloadavg()[0],
    "steps": int(summary["steps"].iloc[0]),
    "late_worker_most_often_last": int(share.idxmax()) == late,
    "late_worker_in_advice": any(f"Worker {late} " in item.title for item in advice),
    "advice_codes": [item.code for item in advice],
}))
"""


def measure(log_dir: Path, late: int) -> dict:
    output = subprocess.run(
        [sys.executable, "-c", _CHILD, str(log_dir), str(ROOT), str(late)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(output.strip().splitlines()[-1])


def bench_variant(out: Path, name: str, args, extra: list[str]) -> dict:
    log_dir = out / name
    if not (log_dir / "keras_dp").exists():
        records_generator.main(
            [
                str(log_dir),
                f"--workers={args.workers}",
                f"--steps={args.steps}",
                f"--late-start={LATE_WORKER % args.workers}:{LATE_MS}",
                *extra,
            ]
        )
    shutil.rmtree(log_dir / "keras_dp" / ".cache", ignore_errors=True)
    late = LATE_WORKER % args.workers
    first = measure(log_dir, late)
    print(f"{name} first: {first}", flush=True)
    cached = []
    for _ in range(args.rounds):
        cached.append(measure(log_dir, late))
        print(f"{name} cached: {cached[-1]}", flush=True)
    size = sum(p.stat().st_size for p in (log_dir / "keras_dp").glob("*.jsonl"))
    return {"name": name, "records_mb": size / 1e6, "first": first, "cached": cached}


def markdown(results: list[dict], args) -> str:
    lines = [
        f"## `Report.load` at cluster scale on generated records (issue 39: goal < "
        f"{GOAL['cpu_s']:.0f} s CPU and < {GOAL['peak_rss_mb'] / 1000:.0f} GB peak RSS, "
        "imports included, cached, fresh process)",
        "",
        f"{args.workers} workers x {args.steps:,} steps written by "
        "`benchmarks/records_generator.py` from docs/records.md alone; worker "
        f"{LATE_WORKER % args.workers} enters every step {LATE_MS:.0f} ms late (an input-bound "
        "straggler whose own step times are the shortest). `Report.load` + `summary()` + "
        "`advice()` + `workers` in a fresh process; CPU time and peak RSS of the whole "
        "process (getrusage), imports included.",
        "",
        "| records | load | CPU | wall | peak RSS | load average | late worker named |",
        "|---|---|---|---|---|---|---|",
    ]
    for result in results:
        for label, run in [("first (uncached)", result["first"])] + [
            (f"cached #{i + 1}", run) for i, run in enumerate(result["cached"])
        ]:
            named = run["late_worker_most_often_last"] and run["late_worker_in_advice"]
            lines.append(
                f"| {result['name']} ({result['records_mb']:.0f} MB) | {label} | "
                f"{run['cpu_s']:.1f} s | {run['wall_s']:.1f} s | {run['peak_rss_mb']:,.0f} MB | "
                f"{run['load_average']:.1f} | {'yes' if named else '**no**'} |"
            )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results = [
        bench_variant(args.out, "steps only", args, []),
        bench_variant(args.out, "with windows", args, ["--windows"]),
    ]
    text = markdown(results, args)
    (args.out / "cluster_scale.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.exit(main())
