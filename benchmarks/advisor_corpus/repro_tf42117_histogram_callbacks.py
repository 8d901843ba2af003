"""Reproduces tensorflow/tensorflow#42117 (two GPUs slower than one, with histograms).

Thread: https://github.com/tensorflow/tensorflow/issues/42117 — training on two 1080 Ti
was slower than on one. The maintainer noticed that only the multi-GPU run used
"callbacks to log histograms on each epoch" ("These ops are executed eagerly"), and that
the batch of 8 was not scaled with the replicas.

Mechanism (cause 3, time outside the steps; cause 1 second): a TensorBoard callback
with ``histogram_freq=1`` writes a histogram of every weight at each epoch's end, and the
epochs are short, so much of ``fit``'s wall time is spent between steps; the global batch
stays 8 (2 examples per replica). A small CNN with many weight tensors.

Usage: python repro_tf42117_histogram_callbacks.py --log-dir runs/tf42117
"""

import os

import _corpus

run = _corpus.start(__doc__)
import keras  # noqa: E402
import numpy as np  # noqa: E402

BATCH_SIZE = 8  # the one-GPU batch, not multiplied by the replica count
rng = np.random.default_rng(3)
x = rng.random((BATCH_SIZE * 6, 32, 32, 3), dtype=np.float32)
y = rng.integers(0, 5, size=(BATCH_SIZE * 6,))

with run.strategy.scope():
    layers = [keras.Input((32, 32, 3))]
    for filters in (16, 32, 32, 64):
        layers += [keras.layers.Conv2D(filters, 3, padding="same", activation="relu")]
        layers += [keras.layers.BatchNormalization()]
    layers += [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(5)]
    model = keras.Sequential(layers)
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )

histograms = keras.callbacks.TensorBoard(
    os.path.join(run.log_dir, "user_tensorboard"), histogram_freq=1
)
model.fit(
    x,
    y,
    batch_size=BATCH_SIZE,
    epochs=5,  # 6 steps an epoch: the per-epoch histograms weigh on every epoch
    verbose=0,
    callbacks=[histograms, *_corpus.fit_callbacks(run, global_batch=BATCH_SIZE)],
)
