"""Runs every reproduction of the advisor corpus, one at a time; never runs the advisor.

Each ``repro_<name>.py`` trains into ``<out>/<name>/`` (``--log-dir``) in its own
process, with a timeout. The cause-6 reproductions need two replica counts at one
per-replica batch, so they run twice, into ``<out>/<name>/replicas-1/`` and
``<out>/<name>/replicas-4/``. The script reports which ran, how long they took, and
whether ``keras_dp/`` records were written (the custom-loop reproductions write none
unless run with ``--training-loop``: our ``fit`` callbacks cannot see ``strategy.run``
loops; ``--training-loop`` is passed to every script, and the fit ones ignore it).

Usage:
    PYTHONPATH=<checkout> python benchmarks/advisor_corpus/run_all.py OUT [--only NAME ...]
        [--half dev|test] [--timeout 180] [--training-loop]
"""

import argparse
import os
import pathlib
import re
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
# Cause 6 is diagnosed from two runs at one per-replica batch (compute per example by
# replica count); the others run once at 4 replicas.
REPLICA_SWEEPS = {
    "tf40421_gru_kernel_fallback": (1, 4),
    "tf33809_ocr_gru_slower_learning": (1, 4),
}


def repro_names():
    """The corpus's reproductions, by the name after ``repro_``."""
    return sorted(path.stem.removeprefix("repro_") for path in HERE.glob("repro_*.py"))


def names_in_half(half):
    """Reads the manifest's table: the reproductions in the dev or the test half."""
    names = []
    for line in (HERE / "MANIFEST.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) > 3 and cells[-1] == half:
            names += re.findall(r"repro_(\w+)\.py", line)
    return names


def run_one(name, log_dir, replicas, timeout, training_loop=False):
    """Runs one reproduction; returns (status, seconds, records written)."""
    command = [sys.executable, str(HERE / f"repro_{name}.py"), "--log-dir", str(log_dir)]
    command += ["--replicas", str(replicas)]
    if training_loop:
        command.append("--training-loop")
    log_dir.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    with open(log_dir / "stdout.txt", "w") as out:
        try:
            code = subprocess.run(
                command, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, check=False
            ).returncode
            status = "ok" if code == 0 else f"exit {code}"
        except subprocess.TimeoutExpired:
            status = f"timeout {timeout}s"
    seconds = time.perf_counter() - began
    records = (log_dir / "keras_dp").is_dir() and any((log_dir / "keras_dp").iterdir())
    return status, seconds, records


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=pathlib.Path, help="folder for the runs")
    parser.add_argument("--only", nargs="*", help="names (after repro_) to run")
    parser.add_argument("--half", choices=("dev", "test"), help="run one half only")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per run")
    parser.add_argument(
        "--training-loop",
        action="store_true",
        help="pass --training-loop to every script (custom loops measured by kdt.TrainingLoop)",
    )
    args = parser.parse_args()
    names = repro_names()
    if args.half:
        names = [name for name in names if name in set(names_in_half(args.half))]
    if args.only:
        names = [name for name in names if name in set(args.only)]
    # Children import the corpus helper beside them and this checkout's package.
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(HERE), str(HERE.parents[1]), env.get("PYTHONPATH", "")]
    ).rstrip(os.pathsep)
    os.environ.update(env)
    failed = 0
    for name in names:
        sweep = REPLICA_SWEEPS.get(name)
        runs = [(args.out / name / f"replicas-{n}", n) for n in sweep] if sweep else []
        runs = runs or [(args.out / name, 4)]
        for log_dir, replicas in runs:
            status, seconds, records = run_one(
                name, log_dir, replicas, args.timeout, args.training_loop
            )
            failed += status != "ok"
            note = "records" if records else "NO keras_dp records"
            print(f"{name:42s} replicas={replicas} {status:10s} {seconds:6.1f}s  {note}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
