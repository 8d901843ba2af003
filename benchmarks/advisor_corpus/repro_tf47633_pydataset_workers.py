"""Reproduces tensorflow/tensorflow#47633 (``workers=8, use_multiprocessing=True`` no help).

Thread: https://github.com/tensorflow/tensorflow/issues/47633 (label comp:dist-strat) — a
model fed from a pandas DataFrame through a Python generator, then a
``keras.utils.Sequence``, with ``workers=8``: the CPU stayed at 100% (one core) and the
GPU at 0-22%. The thread closed without a maintainer's diagnosis ("unresolved"; the
setup is cause 2).

Mechanism reproduced (cause 2, input that does not scale): a ``keras.utils.PyDataset``
with worker threads builds every batch row by row in Python (a dict per row, as
``DataFrame.iterrows`` gives; categorical columns hashed into buckets, numeric ones
log-scaled, per value); the threads share the GIL, so the input runs on about one
core whatever ``workers`` says, and the replicas wait for it.

Usage: python repro_tf47633_pydataset_workers.py --log-dir runs/tf47633
"""

import math
import zlib

import _corpus

run = _corpus.start(__doc__)
import keras  # noqa: E402
import numpy as np  # noqa: E402

PER_REPLICA = 128
global_batch = PER_REPLICA * run.strategy.num_replicas_in_sync
CATEGORICAL = [f"c{i}" for i in range(32)]
NUMERIC = [f"n{i}" for i in range(8)]
BUCKETS = 1000
rng = np.random.default_rng(7)
# A "data frame" as a list of row dicts, the shape iterrows() hands to Python code.
frame = []
for codes, values in zip(
    rng.integers(0, 50000, size=(8000, 32)).tolist(), rng.random((8000, 8)).tolist(), strict=True
):
    row = {f"c{i}": f"id{code}" for i, code in enumerate(codes)}
    row.update({f"n{i}": value for i, value in enumerate(values)})
    row["label"] = float(values[0] + values[1] > 1.0)
    frame.append(row)


def features(row):
    """Per-row feature engineering in Python: hash buckets and log scaling."""
    hashed = [zlib.crc32(f"{c}={row[c]}".encode()) % BUCKETS / BUCKETS for c in CATEGORICAL]
    return hashed + [math.log1p(row[n]) for n in NUMERIC]


class RowBatches(keras.utils.PyDataset):
    """Builds each batch from row dicts in Python (GIL-bound, whatever ``workers`` is)."""

    def __init__(self, batch_size, steps):
        super().__init__(workers=4, use_multiprocessing=False)
        self.batch_size = batch_size
        self.steps = steps

    def __len__(self):
        return self.steps

    def __getitem__(self, index):
        start = (index * self.batch_size) % (len(frame) - self.batch_size)
        rows = frame[start : start + self.batch_size]
        x = np.array([features(row) for row in rows], dtype=np.float32)
        y = np.array([[row["label"]] for row in rows], dtype=np.float32)
        return x, y


with run.strategy.scope():
    model = keras.Sequential(
        [
            keras.Input((40,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(1, activation="sigmoid"),
        ]
    )
    model.compile(optimizer="adam", loss="binary_crossentropy")

model.fit(
    RowBatches(global_batch, steps=40),
    epochs=2,
    verbose=0,
    callbacks=_corpus.fit_callbacks(run, global_batch=global_batch),
)
