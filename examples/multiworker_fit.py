"""Two (or more) worker processes training with MultiWorkerMirroredStrategy, recorded.

Keras 3 fit fails under MultiWorkerMirroredStrategy (keras-team/keras#20585), so this
uses legacy tf_keras (`pip install "keras_dp_tools[multiworker]"`). The launcher starts
one process per worker, each with its TF_CONFIG:

    keras-dp launch --workers 2 -- python examples/multiworker_fit.py LOG_DIR

Or by hand, one process per worker with its index (what the launcher does for you);
the workers agree on one run id when fit begins (docs/records.md, "Run ids"):

    export WORKERS=localhost:23456,localhost:23457
    python examples/multiworker_fit.py 0 LOG_DIR $WORKERS &
    python examples/multiworker_fit.py 1 LOG_DIR $WORKERS

All workers write into the same LOG_DIR (default: KERAS_DP_LOG_DIR, which
`keras-dp launch --log-dir` sets, else runs/multiworker-<run id>);
kdt.Report.load(LOG_DIR) merges them.
"""

import json
import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"

if len(sys.argv) == 4:  # by hand: INDEX LOG_DIR ADDRESSES
    index, log_dir, addresses = int(sys.argv[1]), sys.argv[2], sys.argv[3].split(",")
    os.environ["TF_CONFIG"] = json.dumps(
        {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}
    )
elif "TF_CONFIG" in os.environ:  # keras-dp launch, Kubernetes, ...: [LOG_DIR]
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    run = os.environ.get("KERAS_DP_RUN_ID", "local")
    default = os.environ.get("KERAS_DP_LOG_DIR", f"runs/multiworker-{run}")  # launch --log-dir
    log_dir = sys.argv[1] if len(sys.argv) > 1 else default
else:
    sys.exit(
        "usage: keras-dp launch --workers 2 -- python examples/multiworker_fit.py [LOG_DIR]\n"
        "   or: python examples/multiworker_fit.py INDEX LOG_DIR HOST:PORT,HOST:PORT"
    )

import numpy as np
import tensorflow as tf
import tf_keras as keras

import keras_dp_tools as kdt

strategy = tf.distribute.MultiWorkerMirroredStrategy()
global_batch = kdt.scale_batch_size(16, strategy)
with strategy.scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")

x = np.random.default_rng(index).normal(size=(global_batch * 5, 8)).astype("float32")
dataset = tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1, keepdims=True))).batch(global_batch)
callbacks = kdt.callbacks(log_dir, global_batch=global_batch, profile_start_step=3)
model.fit(dataset, epochs=2, verbose=0, callbacks=callbacks)
print(f"worker {index} done; records in {log_dir}")
