"""Reproduces tensorflow/tensorflow#39494 (distributed training, inefficient input).

Thread: https://github.com/tensorflow/tensorflow/issues/39494 — a 4-GPU machine, Keras
``fit`` on ``tf.data.Dataset.from_generator`` over a Python generator that unpickles one
of 200K files per batch ("one batch is a file"); GPU utilisation was about 15%, and under
MirroredStrategy it was "slower than one gpu". The thread stalled without a maintainer's
diagnosis beyond the input-pipeline guides ("unresolved"; the setup is cause 2).

Mechanism reproduced (cause 2, input that does not scale): ``from_generator`` runs the
Python generator on one thread, one element at a time; each element is a file opened,
gunzipped and unpickled (``pd.read_pickle(..., compression='gzip')`` in the thread) and
reshaped in Python. Storage latency per file (a disk or network read of one of 200K
files) is emulated by a 15 ms wait, since these files sit in the page cache.
``prefetch`` after the generator cannot add parallelism. The model (a small dense
autoencoder on 56 features, as in the thread) is cheap.

Usage: python repro_tf39494_from_generator_files.py --log-dir runs/tf39494
"""

import gzip
import os
import pickle
import tempfile
import time

import _corpus

run = _corpus.start(__doc__)
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

ROWS_PER_FILE = 64 * run.strategy.num_replicas_in_sync  # one file is one global batch
STORAGE_LATENCY_S = 0.015  # emulated: one read of one of 200K files on disk
rng = np.random.default_rng(6)
folder = tempfile.mkdtemp(prefix="tf39494-")
paths = []
for index in range(16):  # gzip-compressed pickles, each a table of rows x 56 columns
    paths.append(os.path.join(folder, f"part-{index:05d}.pkl.gz"))
    with gzip.open(paths[-1], "wb") as handle:
        pickle.dump(rng.random((ROWS_PER_FILE, 8, 7)).tolist(), handle)


def read_files():
    while True:
        for index in rng.permutation(len(paths)):
            time.sleep(STORAGE_LATENCY_S)
            with gzip.open(paths[index], "rb") as handle:
                table = np.asarray(pickle.load(handle), dtype=np.float32)
            features = table.reshape(-1, 56)
            yield features, features


spec = tf.TensorSpec((None, 56), tf.float32)
dataset = tf.data.Dataset.from_generator(read_files, output_signature=(spec, spec))
dataset = dataset.prefetch(tf.data.AUTOTUNE)

with run.strategy.scope():
    model = keras.Sequential(
        [
            keras.Input((56,)),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(56),
        ]
    )
    model.compile(optimizer="adam", loss="mse")

model.fit(
    dataset,
    epochs=2,
    steps_per_epoch=30,
    verbose=0,
    callbacks=_corpus.fit_callbacks(run, global_batch=ROWS_PER_FILE, dataset=dataset),
)
