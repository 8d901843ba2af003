"""Issue 35's equivalence check (throw-away): every frame and finding of ``Report.load``
on a set of datasets, pickled before the refactoring (``--write``) and compared after
it (``--compare``): ``pd.testing.assert_frame_equal`` on each frame, equality of the
summary, comparison, advice, job findings and text.

Run: ``PYTHONPATH=. python benchmarks/refactor35_equivalence.py --write|--compare``
(the datasets are written once into ``--data``; the demo run is made beforehand with
``keras-dp demo --log-dir /tmp/r35_demo``).
"""

from __future__ import annotations

import argparse
import json
import pickle
import shutil
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FRAMES = ["runs", "steps", "replicas", "windows", "gpu", "cpu", "batching", "workers", "restarts"]


def _restart_run(log_dir: Path) -> None:
    """One worker that restarts (a second process, another pid, from step 0 again)."""
    from tests.helpers.recorded_runs import write_run

    for attempt, start in enumerate((100.0, 200.0)):
        fields = {"pid": 10 + attempt, "hostname": "h"}
        write_run(log_dir, run="r", steps=12, start=start, header_fields=fields, profiled=())


def _split(log_dir: Path) -> None:
    """A 3-worker cluster run whose worker 2 recorded under its own run id."""
    from tests.helpers.cluster_records import write_cluster_run

    paths = write_cluster_run(
        log_dir, workers=3, steps=300, windows=((50, 55),), epoch_steps=100, clock_spread_ms=400
    )
    lines = paths[2].read_text().replace('"20261201-120000-c1a5e7"', '"20261201-120001-other"')
    paths[2].write_text(lines)


def make_data(data: Path, demo: Path) -> dict[str, tuple[list[Path], dict]]:
    """name -> (sources, load keywords); written once."""
    from tests.helpers.cluster_records import write_cluster_run
    from tests.helpers.recorded_runs import (
        BALANCED,
        write_run,
        write_scaling_runs,
        write_windowed_multiworker_run,
    )

    # The fixtures copied once: the frames hold each record's source path.
    fixtures = data / "fixtures"
    if not fixtures.exists():
        shutil.copytree(ROOT / "tests" / "fixtures" / "keras_versions", fixtures)
    sets = {
        f"fixture-{path.name}": ([path], {}) for path in sorted(fixtures.iterdir()) if path.is_dir()
    }
    if demo.exists():
        sets["demo"] = ([demo], {})
    builders = {
        "cluster": lambda d: write_cluster_run(
            d, workers=4, steps=600, windows=((100, 105), (400, 405)), epoch_steps=200,
            straggler=2, straggler_ms=4.0,
        ),
        "cluster-killed": lambda d: write_cluster_run(
            d, workers=3, steps=250, windows=((30, 35),), epoch_steps=100, fit_ends=False, seed=3,
        ),
        "restart": _restart_run,
        "split": _split,
        "scaling": write_scaling_runs,
        "windowed-mw": lambda d: write_windowed_multiworker_run(d, gpu_util=60.0),
        "breakdown": lambda d: write_run(d, step_ms=12.0, breakdown=BALANCED, gpu_util=30.0),
    }  # fmt: skip
    for name, build in builders.items():
        folder = data / name
        if not folder.exists():
            folder.mkdir(parents=True)
            build(folder)
        sets[name] = ([folder], {})
    sets["split-merged"] = ([data / "split"], {"merge_runs": "detected"})
    return sets


def outcome(sources, keywords) -> dict:
    import keras_dp_tools as kdt

    report = kdt.Report.load(sources, **keywords)
    result = {name: getattr(report, name) for name in FRAMES}
    result["summary"] = report.summary()
    result["compare"] = report.compare()
    result["advice"] = [item.to_dict() for item in report.advice()]
    result["job_findings"] = [item.to_dict() for item in report.job_findings()]
    result["text"] = report.text()
    runs = list(report.runs["run"].drop_duplicates())
    result["per_run_advice"] = {
        run: [item.to_dict() for item in report.for_run(run).advice()] for run in runs
    }
    return result


def compare(name: str, before: dict, after: dict) -> list[str]:
    problems = []
    for key, old in before.items():
        new = after.get(key)
        if isinstance(old, pd.DataFrame):
            try:
                pd.testing.assert_frame_equal(old, new)
            except AssertionError as error:
                problems.append(f"{name}.{key}: {str(error)[:400]}")
        elif old != new:
            before, after_ = (json.dumps(value, default=str)[:300] for value in (old, new))
            detail = f"{before} != {after_}"
            problems.append(f"{name}.{key}: {detail}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser()
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true")
    mode.add_argument("--compare", action="store_true")
    parser.add_argument("--data", type=Path, default=Path("/tmp/r35_data"))
    parser.add_argument("--demo", type=Path, default=Path("/tmp/r35_demo"))
    parser.add_argument("--baseline", type=Path, default=Path("/tmp/r35_baseline"))
    args = parser.parse_args()
    sets = make_data(args.data, args.demo)
    if args.write:
        shutil.rmtree(args.baseline, ignore_errors=True)
        args.baseline.mkdir(parents=True)
    problems = []
    for name, (sources, keywords) in sets.items():
        result = outcome(sources, keywords)
        path = args.baseline / f"{name}.pkl"
        if args.write:
            path.write_bytes(pickle.dumps(result))
            counts = f"{len(result['steps'])} steps, {len(result['advice'])} findings"
            print(f"{name}: written ({counts})")
            continue
        if not path.exists():
            problems.append(f"{name}: no baseline")
            continue
        found = compare(name, pickle.loads(path.read_bytes()), result)
        print(f"{name}: {'equal' if not found else f'{len(found)} differences'}")
        problems += found
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
