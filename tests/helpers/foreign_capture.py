"""Profiler captures made the way users make them, without keras_dp_tools: run as
``python -m tests.helpers.foreign_capture KIND LOG_DIR`` (a process of its own: one
profiler session per process, and tf_keras must be chosen before TensorFlow loads).

KIND ``keras3``: Keras 3's ``TensorBoard(profile_batch=PROFILE_BATCH)`` in ``fit``, then
a bare ``tf.profiler.experimental.start/stop`` around ``CALLS`` calls of a custom
``tf.function`` train step (under ``LOG_DIR/bare``). ``tf_keras``: tf_keras's
``TensorBoard(profile_batch=PROFILE_BATCH)`` (``TF_USE_LEGACY_KERAS=1``). ``mirrored``:
Keras 3 ``fit`` of one epoch under ``MirroredStrategy`` on ``REPLICAS`` logical CPUs,
inside a bare profiler session (after a first epoch outside it).
"""

from __future__ import annotations

import os
import sys

PROFILE_BATCH = (3, 6)  # 1-based batches of the first epoch
CALLS = 8  # custom train-step calls inside the bare capture
BATCHES = 16  # batches per epoch
REPLICAS = 2  # logical CPUs of the ``mirrored`` capture


def main(kind: str, log_dir: str) -> None:
    if kind == "tf_keras":
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf

    if kind == "mirrored":  # before TensorFlow initialises its devices
        cpu = tf.config.list_physical_devices("CPU")[0]
        logical = [tf.config.LogicalDeviceConfiguration()] * REPLICAS
        tf.config.set_logical_device_configuration(cpu, logical)
    if kind == "tf_keras":
        import tf_keras as keras
    else:
        import keras
    x = np.random.default_rng(0).random((32 * BATCHES, 32), dtype=np.float32)
    y = np.arange(32 * BATCHES) % 4
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def build():
        layers = [keras.Input((32,)), keras.layers.Dense(64, activation="relu")]
        built = keras.Sequential([*layers, keras.layers.Dense(4)])
        built.compile("adam", loss)
        return built

    if kind == "mirrored":
        devices = [f"/cpu:{index}" for index in range(REPLICAS)]
        with tf.distribute.MirroredStrategy(devices).scope():
            model = build()
        model.fit(x, y, batch_size=32, epochs=1, verbose=0)
        tf.profiler.experimental.start(log_dir)
        model.fit(x, y, batch_size=32, epochs=1, verbose=0)
        tf.profiler.experimental.stop()
        return
    model = build()
    board = keras.callbacks.TensorBoard(log_dir, profile_batch=PROFILE_BATCH)
    model.fit(x, y, batch_size=32, epochs=1, callbacks=[board], verbose=0)
    if kind != "keras3":
        return
    optimizer = keras.optimizers.Adam()
    batches = iter(tf.data.Dataset.from_tensor_slices((x, y)).batch(32).repeat())

    @tf.function
    def train_step(features, labels):
        with tf.GradientTape() as tape:
            value = loss(labels, model(features))
        grads = tape.gradient(value, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return value

    train_step(*next(batches))  # traced before the capture
    tf.profiler.experimental.start(os.path.join(log_dir, "bare"))
    for _ in range(CALLS):
        train_step(*next(batches))
    tf.profiler.experimental.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
