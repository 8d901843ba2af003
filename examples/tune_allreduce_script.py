"""A script for ``keras-dp tune-allreduce`` (and ``kdt.find_per_replica_batch``; its
functions also serve ``keras-dp compare-strategies`` through
``compare_strategies_script.py``).

Their trial processes import this file and call its functions:

* ``build_model()``: a compiled Keras model; called inside the strategy's scope.
* ``make_dataset(global_batch)``: a ``tf.data.Dataset`` of batches of ``global_batch``
  examples. ``keras-dp tune-allreduce`` asks for ``PER_REPLICA_BATCH`` per replica.

Nothing runs at import; run the command instead:

    keras-dp tune-allreduce examples/tune_allreduce_script.py --replicas 2 --steps 12
"""

import numpy as np
import tensorflow as tf

# Keras 3, or tf_keras where TF_USE_LEGACY_KERAS=1 (compare-strategies sets it for the
# candidates whose fit needs tf_keras: multi-worker mirrored, parameter servers).
keras = tf.keras

PER_REPLICA_BATCH = 32
FEATURES = 64


def build_model():
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
