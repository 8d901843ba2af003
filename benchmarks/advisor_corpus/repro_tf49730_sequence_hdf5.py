"""Reproduces tensorflow/tensorflow#49730 (fit stuck or slow with MirroredStrategy, 10 GPUs).

Thread: https://github.com/tensorflow/tensorflow/issues/49730 — a ``keras.utils.Sequence``
that reads samples from an HDF5 file fed ``fit``; on one GPU an epoch took 20 s, under
MirroredStrategy over 10 GPUs ``fit`` was "stuck or really slow" (2-3 min). The thread
stalled without a maintainer's diagnosis ("unresolved").

Mechanism reproduced (cause 2, input that does not scale): the batches come from Python
(``keras.utils.PyDataset``, Keras 3's ``Sequence``), assembled one sample at a time by
random access into a large array, as an HDF5 reader does. That Python producer runs on
one host thread however many replicas there are, so every replica waits for it; the
model (inputs of shape (5, 20), as in the thread) is cheap. The store is chunked and
compressed, as HDF5 datasets usually are: reading one row inflates (``zlib``) the chunk
that holds it, so each sample costs a chunk's decompression.

Usage: python repro_tf49730_sequence_hdf5.py --log-dir runs/tf49730
"""

import zlib

import _corpus

run = _corpus.start(__doc__)
import keras  # noqa: E402
import numpy as np  # noqa: E402

PER_REPLICA = 32
global_batch = PER_REPLICA * run.strategy.num_replicas_in_sync


ROWS, CHUNK_ROWS = 8192, 64


class SampleReader(keras.utils.PyDataset):
    """Reads one sample at a time from a chunked, compressed store (HDF5-like)."""

    def __init__(self, batch_size, steps):
        super().__init__()
        rng = np.random.default_rng(4)
        samples = rng.random((ROWS, 5, 20), dtype=np.float32)
        self.chunks = [
            zlib.compress(samples[start : start + CHUNK_ROWS].tobytes())
            for start in range(0, ROWS, CHUNK_ROWS)
        ]
        self.labels = rng.integers(0, 2, size=(ROWS, 1)).astype("float32")
        self.batch_size = batch_size
        self.steps = steps
        self.rng = np.random.default_rng(5)

    def __len__(self):
        return self.steps

    def read_row(self, row):
        chunk = np.frombuffer(zlib.decompress(self.chunks[row // CHUNK_ROWS]), np.float32)
        return chunk.reshape(CHUNK_ROWS, 5, 20)[row % CHUNK_ROWS]

    def __getitem__(self, index):
        rows = self.rng.integers(0, ROWS, size=self.batch_size)
        xs, ys = [], []
        for row in rows:  # one read per sample, as a row-wise HDF5 read
            sample = self.read_row(int(row))
            xs.append((sample - sample.mean()) / (sample.std() + 1e-6))
            ys.append(self.labels[int(row)])
        return np.stack(xs), np.stack(ys)


with run.strategy.scope():
    model = keras.Sequential(
        [
            keras.Input((5, 20)),
            keras.layers.Flatten(),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(1, activation="sigmoid"),
        ]
    )
    model.compile(optimizer="adam", loss="binary_crossentropy")

model.fit(
    SampleReader(global_batch, steps=40),
    epochs=2,
    verbose=0,
    callbacks=_corpus.fit_callbacks(run, global_batch=global_batch),
)
