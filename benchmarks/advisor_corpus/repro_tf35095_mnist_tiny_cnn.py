"""Reproduces tensorflow/tensorflow#35095 (MirroredStrategy slower than OneDeviceStrategy).

Thread: https://github.com/tensorflow/tensorflow/issues/35095 — the MNIST example with a
small CNN (one Conv2D, a 24-unit Dense) took 286 s on two GPUs under MirroredStrategy and
197 s on one.

Mechanism (cause 1, too little work per step): the model is tiny and the user kept the
one-device batch as the global batch (strong scaling), so each replica computes a few
milliseconds per step next to fixed per-step costs (dispatch, the all-reduce, host
work) that do not shrink with replicas. Here: the same shape of CNN on 28x28 synthetic
images, a global batch of 64 split over 4 replicas (16 examples each).

Usage: python repro_tf35095_mnist_tiny_cnn.py --log-dir runs/tf35095
"""

import _corpus

run = _corpus.start(__doc__)
import keras  # noqa: E402
import numpy as np  # noqa: E402

GLOBAL_BATCH = 64  # the one-GPU batch, kept as the global batch under the strategy
rng = np.random.default_rng(0)
x = rng.random((GLOBAL_BATCH * 60, 28, 28, 1), dtype=np.float32)
y = rng.integers(0, 10, size=(GLOBAL_BATCH * 60,))

with run.strategy.scope():
    model = keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(16, 7, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(24, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")

model.fit(
    x,
    y,
    batch_size=GLOBAL_BATCH,
    epochs=2,
    verbose=0,
    callbacks=_corpus.fit_callbacks(run, global_batch=GLOBAL_BATCH),
)
