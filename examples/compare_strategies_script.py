"""A script for ``keras-dp compare-strategies`` (and ``kdt.compare_strategies``).

Each candidate's processes import this file and call its functions:

* ``build_model()``: a compiled Keras model; called inside the strategy's scope. It uses
  ``tf.keras``, which is Keras 3 in most candidates and tf_keras under
  ``multi_worker_mirrored`` and ``parameter_server`` (their trials set
  ``TF_USE_LEGACY_KERAS=1``: Keras 3's fit does not run under them).
* ``make_dataset(global_batch)``: a ``tf.data.Dataset`` of batches of ``global_batch``
  examples (the per-replica batch times the candidate's replicas).

Nothing runs at import; run the command instead:

    keras-dp compare-strategies examples/compare_strategies_script.py --steps 12
"""

import numpy as np
import tensorflow as tf

FEATURES = 64


def build_model():
    keras = tf.keras
    model = keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    return model


def make_dataset(global_batch):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(global_batch * 8, FEATURES)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch, drop_remainder=True)
