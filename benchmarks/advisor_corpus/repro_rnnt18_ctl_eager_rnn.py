"""Reproduces noahchalifour/rnnt-speech-recognition#18 (multi-GPU training not working).

Thread: https://github.com/noahchalifour/rnnt-speech-recognition/issues/18 — an RNN-T
speech model trained with a custom loop on several GPUs was no faster; the log shows
TensorFlow's warning "Using MirroredStrategy eagerly has significant overhead currently
... please wrap `call_for_each_replica` or `experimental_run` ... inside a tf.function".

Mechanism (cause 5, a custom training loop, run eagerly): the distributed step of a
recurrent model is called without ``tf.function``; MirroredStrategy then runs the
replicas' Python one after another and every op is dispatched eagerly, per time step of
the GRU. Our ``fit`` callbacks cannot see this loop: the script writes NO ``keras_dp/``
records today, only its step times (``--training-loop`` measures it with
``kdt.TrainingLoop``).

Usage: python repro_rnnt18_ctl_eager_rnn.py --log-dir runs/rnnt18 [--training-loop]
"""

import time

import _corpus

run = _corpus.start(__doc__)
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

strategy = run.strategy
PER_REPLICA = 8
global_batch = PER_REPLICA * strategy.num_replicas_in_sync
rng = np.random.default_rng(10)
mel = rng.random((global_batch * 3, 12, 40), dtype=np.float32)  # frames x mel bins
tokens = rng.integers(0, 30, size=(global_batch * 3,))
dataset = tf.data.Dataset.from_tensor_slices((mel, tokens)).repeat().batch(global_batch)
dist_dataset = strategy.experimental_distribute_dataset(dataset)

with strategy.scope():
    encoder = keras.Sequential(
        [keras.Input((12, 40)), keras.layers.GRU(64), keras.layers.Dense(30)]
    )
    optimizer = keras.optimizers.Adam()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)


def replica_step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.nn.compute_average_loss(
            loss_fn(y, encoder(x, training=True)), global_batch_size=global_batch
        )
    grads = tape.gradient(loss, encoder.trainable_variables)
    optimizer.apply_gradients(zip(grads, encoder.trainable_variables, strict=True))
    return loss


step_seconds = []
iterator = iter(dist_dataset)
# --training-loop: kdt.TrainingLoop measures the steps (a window over steps 1-5).
with _corpus.training_loop(run, encoder, global_batch=global_batch, profile_start_step=1) as loop:
    for _step in range(6):
        began = time.perf_counter()
        with loop.step():
            losses = strategy.run(replica_step, args=next(iterator))  # eager: no tf.function
            loss = float(strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None))
        step_seconds.append(time.perf_counter() - began)
print("median step ms:", 1000 * float(np.median(step_seconds[1:])), "loss", loss)
_corpus.save_loop_times(run, step_seconds)
