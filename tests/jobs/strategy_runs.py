"""Fits under strategies other than MirroredStrategy, each into <log_dir>/<name>; run as
a script (its own process: the test session's strategy and devices stay untouched).

Prints one JSON line per fit: the warnings of ours it raised (category, message, file)
and how fit ended.
"""

import json
import os
import socket
import sys
import warnings

import numpy as np

FILE = os.path.abspath(__file__)


def fit(name, keras, strategy, log_dir, dataset=None, **fit_args):
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
    x = np.random.default_rng(0).normal(size=(32 * 10, 8)).astype("float32")
    data = {"x": dataset} if dataset is not None else {"x": x, "y": x[:, :1], "batch_size": 32}
    callbacks = kdt.callbacks(
        os.path.join(log_dir, name), profile_start_step=2, per_replica_batch=8
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            history = model.fit(**data, epochs=2, verbose=0, callbacks=callbacks, **fit_args)
            ended = f"epochs={len(history.history['loss'])}"
        except Exception as error:
            ended = f"{type(error).__name__}: {error}"[:300]
    ours = [
        {"category": w.category.__name__, "message": str(w.message), "file": w.filename}
        for w in caught
        if w.category.__module__.startswith("keras_dp_tools")
    ]
    print(json.dumps({"name": name, "ended": ended, "warnings": ours}), flush=True)


def in_process_cluster(tf):
    """One worker and one parameter server on loopback ports, in this process."""
    sockets = [socket.socket() for _ in range(2)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    worker, ps = (f"127.0.0.1:{sock.getsockname()[1]}" for sock in sockets)
    for sock in sockets:
        sock.close()
    cluster = tf.train.ClusterSpec({"worker": [worker], "ps": [ps]})
    tf.distribute.Server(cluster, job_name="worker", task_index=0, protocol="grpc")
    tf.distribute.Server(cluster, job_name="ps", task_index=0, protocol="grpc")
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(cluster, rpc_layer="grpc")
    return tf.distribute.ParameterServerStrategy(resolver)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(FILE))))
    import tensorflow as tf

    import keras_dp_tools as kdt

    kdt.configure_devices(4)
    import keras
    import tf_keras

    log_dir = sys.argv[1]
    fit("one_device", keras, tf.distribute.OneDeviceStrategy("/cpu:0"), log_dir)
    fit("one_device_cpu1", keras, tf.distribute.OneDeviceStrategy("/cpu:1"), log_dir)
    central = tf.distribute.experimental.CentralStorageStrategy(["/cpu:0", "/cpu:1"])
    fit("central_storage", keras, central, log_dir)
    strategy = in_process_cluster(tf)
    examples = np.zeros((64, 8), "float32")
    dataset = tf.data.Dataset.from_tensor_slices((examples, examples[:, :1])).repeat().batch(32)
    fit("parameter_server", tf_keras, strategy, log_dir, dataset, steps_per_epoch=3)
    # Keras 3 has no parameter-server support in fit: see what it does with our callbacks.
    fit("parameter_server_keras3", keras, strategy, log_dir, dataset, steps_per_epoch=3)
