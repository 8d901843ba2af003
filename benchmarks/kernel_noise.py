"""How far apart two runs of one model are in compute per example and op-type mix: the
noise the slower-kernels finding must stand above (benchmarks/NOTES.md, "Kernels slower
under the strategy").

A Conv1D + GRU model at 16 examples per replica, profiled for 5 steps. Run it at 1 and 4
replicas, twice each, with and without ``--cell`` (``RNN(GRUCell)`` in place of
``GRU``), then compare the runs with ``--compare``:

    python benchmarks/kernel_noise.py --log-dir runs/kn/a-r1 --replicas 1
    python benchmarks/kernel_noise.py --log-dir runs/kn/a-r4 --replicas 4 [--cell]
    python benchmarks/kernel_noise.py --compare runs/kn/a-r1 runs/kn/a-r4 ...
"""

from __future__ import annotations

import argparse
import itertools

PER_REPLICA = 16


def train(log_dir: str, replicas: int, cell: bool) -> None:
    import keras_dp_tools as kdt

    strategy = kdt.mirrored_strategy(replicas)  # before TensorFlow starts
    import keras
    import numpy as np

    batch = PER_REPLICA * replicas
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch * 20, 24, 16)).astype("float32")
    y = rng.integers(0, 10, size=(batch * 20,))
    with strategy.scope():
        recurrent = keras.layers.RNN(keras.layers.GRUCell(48)) if cell else keras.layers.GRU(48)
        model = keras.Sequential(
            [
                keras.Input((24, 16)),
                keras.layers.Conv1D(32, 3, activation="relu"),
                recurrent,
                keras.layers.Dense(10),
            ]
        )
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callbacks = kdt.callbacks(log_dir, advise=False, profile_start_step=5)
    model.fit(x, y, batch_size=batch, epochs=1, verbose=0, callbacks=callbacks)


def compare(log_dirs: list[str]) -> None:
    """Each pair's compute-per-example ratio and op-type mix change."""
    import keras_dp_tools as kdt
    from keras_dp_tools.analysis.kernel_advice import compute_per_example, mix_change

    per_example = {}
    for log_dir in log_dirs:
        per_example[log_dir] = compute_per_example(kdt.Report.load(log_dir).frames)
    for first, second in itertools.combinations(log_dirs, 2):
        a, b = per_example[first], per_example[second]
        rise, change = b.sum() / a.sum(), mix_change(a, b)
        print(f"{first} -> {second}: compute per example {rise:.2f}x, mix change {change:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log-dir")
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--cell", action="store_true", help="RNN(GRUCell) instead of GRU")
    parser.add_argument("--compare", nargs="+", metavar="LOG_DIR")
    args = parser.parse_args()
    if args.compare:
        compare(args.compare)
    else:
        train(args.log_dir, args.replicas, args.cell)


if __name__ == "__main__":
    main()
