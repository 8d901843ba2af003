"""Interleaved A/B of the always-on callbacks' (StepTimer, GpuMonitor) hook time per
step: the package at a git revision against the working tree, each round one fresh
process per tree, the order alternating. Ratios of medians, never absolute times.

    python benchmarks/hooks_ab.py --baseline 2efc041 --rounds 5
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# One fit of a small model on 4 logical CPUs; the hooks' time per step, after warm-up.
# HookTimer comes from this checkout's benchmarks/ (argv[1], after the tree's package on the
# path), so both trees are timed by the same instrument.
CHILD = r"""
import json, statistics, sys, tempfile
import keras_dp_tools as kdt
kdt.configure_devices(4)
import keras, numpy as np, tensorflow as tf
sys.path.append(sys.argv[1])
from benchmarks.hook_timing import HookTimer
strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(4)])
with strategy.scope():
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
x, y = np.zeros((64 * 300, 64), "float32"), np.zeros((64 * 300, 1), "float32")
log = tempfile.mkdtemp()
callbacks = [kdt.StepTimer(log), kdt.GpuMonitor(log)]
timer = HookTimer(callbacks)
model.fit(x, y, batch_size=64, epochs=1, verbose=0, callbacks=callbacks)
print(json.dumps({
    "wall_us": 1e6 * statistics.median(timer.per_step_wall_s[20:]),
    "cpu_us": 1e6 * statistics.median(timer.per_step_cpu_s[20:]),
    "file": kdt.__file__,
}))
"""


def export_tree(revision: str, folder: Path) -> Path:
    folder.mkdir(parents=True)
    command = ["git", "-C", str(ROOT), "archive", revision, "keras_dp_tools"]
    archive = subprocess.run(command, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder


def measure(tree: Path, scratch: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree), "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(ROOT)],
        env=env,
        capture_output=True,
        text=True,
        cwd=scratch,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the fit under {tree} failed: {done.stderr[-2000:]}")
    row = json.loads(done.stdout.strip().splitlines()[-1])
    if not row["file"].startswith(str(tree)):  # the other tree's package was imported
        raise RuntimeError(f"expected the package under {tree}, imported {row['file']}")
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="2efc041", help="git revision to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="kdp_hooks_ab_"))
    trees = {"before": export_tree(args.baseline, scratch / "base"), "after": ROOT}
    rows = {name: [] for name in trees}
    for index in range(args.rounds):
        order = list(trees) if index % 2 == 0 else list(reversed(trees))
        for name in order:
            rows[name].append(measure(trees[name], scratch))
            print(name, rows[name][-1], flush=True)
    for key in ("wall_us", "cpu_us"):
        before = statistics.median(row[key] for row in rows["before"])
        after = statistics.median(row[key] for row in rows["after"])
        spread = {name: [round(row[key]) for row in rows[name]] for name in rows}
        print(f"{key}: before {before:.1f} after {after:.1f} ratio {after / before:.3f} {spread}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
