"""Experiment, not a test: profile every worker of a 2-worker job, two ways.

``server``: each worker runs ``tf.profiler.experimental.server.start(port)`` and worker 0
captures all of them with one ``tf.profiler.experimental.client.trace("grpc://...,...")``
(what TensorBoard's "Capture profile" does). ``inprocess``: every worker profiles itself
with ``kdt.DataParallelProfiler(all_workers=True)`` (in-process start/stop).

    for i in 1 2 3 4 5 6; do for mode in server inprocess; do
      keras-dp launch --workers 2 --grace 3 -- \
        python tests/jobs/multihost_capture.py $mode /tmp/mh/$mode-$i $((30000 + RANDOM % 20000))
    done; done

Seen on the 2-core CPU machine (TF 2.21, tf_keras, 6 runs each, interleaved): worker 1
crashed in 1 of 6 runs either way ("double free or corruption" abort during the server
capture; a segfault inside profiler_v2.stop in-process). So neither is reliable for
non-chief workers, and only worker 0 profiles by default.
"""

import json
import os
import sys
import threading
import time

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np
import tensorflow as tf
import tf_keras as keras

import keras_dp_tools as kdt

mode, log_dir, base_port = sys.argv[1], sys.argv[2], int(sys.argv[3])
config = json.loads(os.environ["TF_CONFIG"])
index, workers = config["task"]["index"], len(config["cluster"]["worker"])
strategy = tf.distribute.MultiWorkerMirroredStrategy()
global_batch = 8 * strategy.num_replicas_in_sync
with strategy.scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
x = np.zeros((global_batch * 40, 8), "float32")
dataset = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(global_batch)


def capture_all_workers():
    addresses = ",".join(f"grpc://localhost:{base_port + i}" for i in range(workers))
    try:
        tf.profiler.experimental.client.trace(addresses, os.path.join(log_dir, "mh"), 1500)
        print("capture ok", flush=True)
    except Exception as error:
        print("capture failed", type(error).__name__, error, flush=True)


class Pace(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.02)  # steps long enough for a 1.5 s capture to catch several
        if mode == "server" and index == 0 and batch == 5:
            threading.Thread(target=capture_all_workers).start()


callbacks = [Pace(), kdt.StepTimer(log_dir)]
if mode == "server":
    tf.profiler.experimental.server.start(base_port + index)
else:
    callbacks.append(kdt.DataParallelProfiler(log_dir, start_step=5, all_workers=True))
model.fit(dataset, epochs=1, verbose=0, callbacks=callbacks)
time.sleep(1.0)
print("worker", index, "done", flush=True)
