"""Add keras_dp_tools to your own model.fit: the README's snippet in a runnable script.

    python examples/minimal_fit.py [LOG_DIR]

Runs on GPUs if there are any, else on the CPU split into 4 logical devices.
"""

import sys

import numpy as np

import keras_dp_tools as kdt

log_dir = sys.argv[1] if len(sys.argv) > 1 else "runs/minimal_fit"
devices = kdt.configure_devices()  # first thing: may split the CPU into logical devices

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

strategy = tf.distribute.MirroredStrategy(devices)
global_batch = kdt.scale_batch_size(32, strategy)  # 32 examples per replica
with strategy.scope():
    model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(64), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")

x = np.random.default_rng(0).normal(size=(global_batch * 20, 20)).astype("float32")
y = x.sum(axis=1, keepdims=True)
model.fit(
    x,
    y,
    batch_size=global_batch,
    epochs=2,
    verbose=2,
    callbacks=kdt.callbacks(log_dir, global_batch=global_batch),
)
print(kdt.Report.load(log_dir).summary().to_string())
