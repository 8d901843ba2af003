"""Reproduces tensorflow/tensorflow#34008 (step time grows with GPUs in a custom loop).

Thread: https://github.com/tensorflow/tensorflow/issues/34008 — a custom training loop
(``GradientTape``, ``strategy.experimental_run_v2``) on dummy data: 0.47 s a step on one
Titan X, 1.1 s on two, 1.4 s on three, "as if they run serially". Another user in the
thread found his own custom loop 1.2-1.3x slower than ``fit`` on several GPUs and never
matched it; no maintainer diagnosis ("unresolved"; cause class 5).

Mechanism (cause 5, a custom training loop): ``strategy.run`` inside a ``tf.function``
over a distributed dataset, with the loss and metrics read back on the host every step
(``float(loss)``), which serialises the host with the replicas each step. Our ``fit``
callbacks cannot see this loop: the script writes NO ``keras_dp/`` records today, only
its own step times (``loop_step_seconds.json``; ``--training-loop`` measures it with
``kdt.TrainingLoop``).

Usage: python repro_tf34008_ctl_proportional.py --log-dir runs/tf34008 [--training-loop]
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
rng = np.random.default_rng(8)
images = rng.random((global_batch * 8, 32, 32, 3), dtype=np.float32)
targets = rng.random((global_batch * 8, 1), dtype=np.float32)
dataset = tf.data.Dataset.from_tensor_slices((images, targets)).repeat().batch(global_batch)
dist_dataset = strategy.experimental_distribute_dataset(dataset)

with strategy.scope():
    model = keras.Sequential(
        [
            keras.Input((32, 32, 3)),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(1),
        ]
    )
    optimizer = keras.optimizers.Adam()
    optimizer.build(model.trainable_variables)  # slots before tf.function, not in it


def replica_step(x, y):
    with tf.GradientTape() as tape:
        per_example = tf.reduce_mean(tf.square(model(x, training=True) - y), axis=1)
        loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    return loss


@tf.function
def train_step(batch):
    losses = strategy.run(replica_step, args=batch)
    return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)


step_seconds = []
iterator = iter(dist_dataset)
# --training-loop: kdt.TrainingLoop measures the steps (a window over steps 5-9).
with _corpus.training_loop(run, model, global_batch=global_batch) as loop:
    for _step in range(60):
        began = time.perf_counter()
        with loop.step():
            loss = float(train_step(next(iterator)))  # host read-back every step
        step_seconds.append(time.perf_counter() - began)
print("median step ms:", 1000 * float(np.median(step_seconds[5:])), "loss", loss)
_corpus.save_loop_times(run, step_seconds)
