"""Issue 35's throw-away timing check: ``Report.load`` (+ summary, advice, workers) of a
cluster run and of 1M single-worker step records, in fresh processes, with two
checkouts' ``keras_dp_tools`` interleaved (A, B, B, A, ...).

Run: ``python benchmarks/refactor35_bench.py BASE_ROOT NEW_ROOT [--workers 64 --steps 20000]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench import measure_cluster_load, write_step_records  # noqa: E402

_LOAD_CHILD = """
import json, sys, time
sys.path.insert(0, sys.argv[2])
from keras_dp_tools.report.facade import Report
import keras_dp_tools.analysis.summary
start = time.perf_counter()
report = Report.load(sys.argv[1])
load = time.perf_counter() - start
start = time.perf_counter()
workers = len(report.workers)
print(json.dumps({"load_s": load, "workers_s": time.perf_counter() - start}))
"""


def load_rows(log_dir: Path, root: Path) -> dict:
    command = [sys.executable, "-c", _LOAD_CHILD, str(log_dir), str(root)]
    return json.loads(subprocess.check_output(command, text=True).splitlines()[-1])


def main() -> None:
    from tests.helpers.cluster_records import write_cluster_run

    parser = argparse.ArgumentParser()
    parser.add_argument("base", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--folder", type=Path, default=Path("/tmp/r35_bench"))
    args = parser.parse_args()
    cluster = args.folder / f"cluster_{args.workers}x{args.steps}"
    if not cluster.exists():
        steps = args.steps
        windows = tuple((step, step + 5) for step in (100, steps * 2 // 5, steps * 4 // 5))
        write_cluster_run(cluster, workers=args.workers, steps=steps, windows=windows)
    rows = args.folder / f"records_{args.rows}"
    if not rows.exists():
        write_step_records(rows / "keras_dp" / "worker-0.jsonl", args.rows)
    measure_cluster_load(cluster, args.new)  # writes the columnar cache: not timed
    load_rows(rows, args.new)
    results = {"base": [], "new": []}
    for number in range(args.rounds):
        order = ("base", "new") if number % 2 == 0 else ("new", "base")
        for name in order:
            root = getattr(args, name)
            measured = measure_cluster_load(cluster, root)
            measured["rows"] = load_rows(rows, root)
            results[name].append(measured)
            print(name, json.dumps({k: measured[k] for k in ("total_wall_s", "peak_rss_mb")}))
    for name, runs in results.items():
        parts = {
            f"{part} {key}": round(statistics.median(run[part][key] for run in runs), 3)
            for part in ("load", "summary", "advice", "workers")
            for key in ("wall_s", "cpu_s")
        }
        print(
            name,
            "cluster total wall median",
            round(statistics.median(run["total_wall_s"] for run in runs), 3),
            "cpu",
            round(statistics.median(run["total_cpu_s"] for run in runs), 3),
            "peak MB",
            round(statistics.median(run["peak_rss_mb"] for run in runs)),
            parts,
            f"| {args.rows} rows load",
            round(statistics.median(run["rows"]["load_s"] for run in runs), 3),
            "workers",
            round(statistics.median(run["rows"]["workers_s"] for run in runs), 3),
        )


if __name__ == "__main__":
    main()
