"""One tf_keras worker of a two-worker MultiWorkerMirroredStrategy run whose all-reduce
is large enough (4.2 MB of gradients) for a rate-limited link to set the step time.

    python tests/jobs/link_worker.py INDEX LOG_DIR HOST:PORT,HOST:PORT STEPS PHASES

Trains PHASES fits of STEPS steps, fit k into LOG_DIR/phase-<k>, each once the file
LOG_DIR/go-<k> exists (the test changes the link's rate in between), and writes
LOG_DIR/done-<k>-<INDEX> after it: one TensorFlow start-up for all the rates.
"""

import json
import os
import sys
import time
from pathlib import Path

os.environ["TF_USE_LEGACY_KERAS"] = "1"
index, log_dir, addresses = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
steps, phases = int(sys.argv[4]), int(sys.argv[5])
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
for phase in range(phases):
    while not (log_dir / f"go-{phase}").exists():
        time.sleep(0.05)
    callbacks = kdt.callbacks(
        log_dir / f"phase-{phase}",
        global_batch=global_batch,
        profile_start_step=phase * steps + 3,
        monitor=False,
        advise=False,
    )
    model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=callbacks)
    (log_dir / f"done-{phase}-{index}").touch()
print(f"worker {index} done")
