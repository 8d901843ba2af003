"""Reproduces tensorflow/tensorflow#38924 (parallel GPUs working like serial).

Thread: https://github.com/tensorflow/tensorflow/issues/38924 — a custom loop calls
``strategy.experimental_run_v2(train_step, ...)`` for each element of a distributed
dataset; timestamps inside the step showed the GPUs running one after another. The
thread's code has the step function's decorator commented out
(``# @tf.function(experimental_relax_shapes=True)``), so the step ran eagerly.

Mechanism (cause 5, a custom training loop, run eagerly): without ``tf.function``,
MirroredStrategy runs each replica's function in Python, one replica after another
(TensorFlow warns that using MirroredStrategy eagerly has significant overhead), so the
step time grows with the replica count. Our ``fit`` callbacks cannot see this loop: the
script writes NO ``keras_dp/`` records today, only its step times (``--training-loop``
measures it with ``kdt.TrainingLoop``).

Usage: python repro_tf38924_ctl_eager_serial.py --log-dir runs/tf38924 [--training-loop]
"""

import time

import _corpus

run = _corpus.start(__doc__)
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

strategy = run.strategy
PER_REPLICA = 16
global_batch = PER_REPLICA * strategy.num_replicas_in_sync
rng = np.random.default_rng(9)
features = rng.random((global_batch * 4, 40, 20), dtype=np.float32)
labels = rng.integers(0, 10, size=(global_batch * 4,))
dataset = tf.data.Dataset.from_tensor_slices((features, labels)).repeat().batch(global_batch)
dist_dataset = strategy.experimental_distribute_dataset(dataset)

with strategy.scope():
    model = keras.Sequential(
        [
            keras.Input((40, 20)),
            keras.layers.Conv1D(64, 5, activation="relu"),
            keras.layers.Conv1D(64, 5, activation="relu"),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(10),
        ]
    )
    optimizer = keras.optimizers.Adam()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)


# @tf.function  -- left out, as in the thread: strategy.run then runs eagerly
def train_step(batch):
    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(
                loss_fn(y, model(x, training=True)), global_batch_size=global_batch
            )
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    losses = strategy.run(replica_step, args=batch)
    return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)


step_seconds = []
iterator = iter(dist_dataset)
# --training-loop: kdt.TrainingLoop measures the steps (a window over steps 3-7).
with _corpus.training_loop(run, model, global_batch=global_batch, profile_start_step=3) as loop:
    for _step in range(12):
        began = time.perf_counter()
        with loop.step():
            loss = float(train_step(next(iterator)))
        step_seconds.append(time.perf_counter() - began)
print("median step ms:", 1000 * float(np.median(step_seconds[3:])), "loss", loss)
_corpus.save_loop_times(run, step_seconds)
