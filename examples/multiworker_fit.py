"""Two (or more) worker processes training with MultiWorkerMirroredStrategy, recorded.

Keras 3 fit fails under MultiWorkerMirroredStrategy (keras-team/keras#20585), so this
uses legacy tf_keras (`pip install "keras_dp_tools[multiworker]"`). Start one process
per worker, each with its index; all of them write into the same LOG_DIR:

    export KERAS_DP_RUN_ID=mw1 WORKERS=localhost:23456,localhost:23457
    python examples/multiworker_fit.py 0 LOG_DIR $WORKERS &
    python examples/multiworker_fit.py 1 LOG_DIR $WORKERS

KERAS_DP_RUN_ID gives the workers' records one run id; kdt.Report.load(LOG_DIR) merges them.
"""

import json
import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"

index, log_dir, addresses = int(sys.argv[1]), sys.argv[2], sys.argv[3].split(",")
os.environ["TF_CONFIG"] = json.dumps(
    {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}
)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

import keras_dp_tools as kdt  # noqa: E402

strategy = tf.distribute.MultiWorkerMirroredStrategy()
global_batch = kdt.scale_batch_size(16, strategy)
with strategy.scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")

x = np.random.default_rng(index).normal(size=(global_batch * 5, 8)).astype("float32")
dataset = tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1, keepdims=True))).batch(global_batch)
callbacks = kdt.callbacks(log_dir, global_batch=global_batch, profile_start_step=3)
model.fit(dataset, epochs=2, verbose=0, callbacks=callbacks)
print(f"worker {index} done")
