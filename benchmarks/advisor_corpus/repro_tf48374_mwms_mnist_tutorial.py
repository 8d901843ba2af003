"""Reproduces tensorflow/tensorflow#48374 (MultiWorkerMirroredStrategy slower than one).

Thread: https://github.com/tensorflow/tensorflow/issues/48374 — the multi-worker Keras
tutorial (MNIST, one Conv2D(32, 3), Dense(128)) ran much slower distributed than
non-distributed. The maintainer: the tutorial "is intended to demonstrate just the
mechanics", MNIST being used to keep the model and data simple.

Mechanism (cause 1, too little work per step): the tutorial's model does a few
milliseconds of work per replica per step, so the synchronisation and per-step
overheads of the strategy dominate. Reproduced with MirroredStrategy on 4 logical CPU
devices (the mechanism is the same as with workers): the tutorial's model, a per-replica
batch of 16, a repeated tf.data pipeline with ``steps_per_epoch``.

Usage: python repro_tf48374_mwms_mnist_tutorial.py --log-dir runs/tf48374
"""

import _corpus

run = _corpus.start(__doc__)
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

PER_REPLICA = 16
global_batch = PER_REPLICA * run.strategy.num_replicas_in_sync
rng = np.random.default_rng(1)
images = rng.random((2048, 28, 28), dtype=np.float32)
labels = rng.integers(0, 10, size=(2048,))
dataset = (
    tf.data.Dataset.from_tensor_slices((images, labels)).shuffle(2048).repeat().batch(global_batch)
)

with run.strategy.scope():
    model = keras.Sequential(
        [
            keras.Input((28, 28)),
            keras.layers.Reshape((28, 28, 1)),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.001),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )

model.fit(
    dataset,
    epochs=2,
    steps_per_epoch=35,
    verbose=0,
    callbacks=_corpus.fit_callbacks(
        run, global_batch=global_batch, dataset=dataset, per_replica_batch=PER_REPLICA
    ),
)
