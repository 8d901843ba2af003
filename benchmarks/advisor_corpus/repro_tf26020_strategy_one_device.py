"""Reproduces tensorflow/tensorflow#26020 (MirroredStrategy doesn't use the GPUs).

Thread: https://github.com/tensorflow/tensorflow/issues/26020 — after moving to
``tf.data`` and MirroredStrategy (TF 1.12, two Titan X), training ran without using the
GPUs; the log lists the devices the strategy left out: "Device is available but not used
by distribute strategy". No maintainer diagnosis beyond that log ("unresolved" as to
why; the symptom is cause 4).

Mechanism (cause 4, no data parallelism): more devices are visible (4 logical CPU
devices here) than the strategy uses — the strategy is built over one device, so
``fit`` runs one replica, all-reduces nothing, and the other devices stay idle.

Usage: python repro_tf26020_strategy_one_device.py --log-dir runs/tf26020
"""

import _corpus

run = _corpus.start(__doc__)  # 4 logical devices exist after this
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

visible = tf.config.list_logical_devices("CPU")
print("visible devices:", [device.name for device in visible])
strategy = tf.distribute.MirroredStrategy(devices=[visible[0].name])  # one of them only
print("replicas in sync:", strategy.num_replicas_in_sync)

GLOBAL_BATCH = 128
rng = np.random.default_rng(13)
x = rng.random((GLOBAL_BATCH * 30, 32, 32, 3), dtype=np.float32)
y = rng.integers(0, 10, size=(GLOBAL_BATCH * 30,))
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH).prefetch(2)

with strategy.scope():
    model = keras.Sequential(
        [
            keras.Input((32, 32, 3)),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(10),
        ]
    )
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )

model.fit(
    dataset,
    epochs=2,
    verbose=0,
    callbacks=_corpus.fit_callbacks(run, global_batch=GLOBAL_BATCH, dataset=dataset),
)
