"""One tf_keras worker of a two-worker MultiWorkerMirroredStrategy run whose all-reduce
is large enough (4 MiB of gradients) for a rate-limited link to set the step time.

    python tests/link_worker.py INDEX LOG_DIR HOST:PORT,HOST:PORT STEPS
"""

import json
import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"
index, log_dir, addresses, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
os.environ["TF_CONFIG"] = json.dumps(
    {"cluster": {"worker": addresses.split(",")}, "task": {"type": "worker", "index": int(index)}}
)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

import keras_dp_tools as kdt  # noqa: E402

strategy = tf.distribute.MultiWorkerMirroredStrategy()
global_batch = kdt.scale_batch_size(8, strategy)
with strategy.scope():
    model = keras.Sequential(
        [keras.Input((1024,)), keras.layers.Dense(1024), keras.layers.Dense(1)]
    )
    model.compile(optimizer=keras.optimizers.SGD(1e-3), loss="mse")
x = np.random.default_rng(0).normal(size=(global_batch, 1024)).astype("float32")
dataset = tf.data.Dataset.from_tensors((x, x[:, :1])).repeat()
callbacks = kdt.callbacks(
    log_dir, global_batch=global_batch, profile_start_step=3, monitor=False, advise=False
)
model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=callbacks)
print(f"worker {index} done")
