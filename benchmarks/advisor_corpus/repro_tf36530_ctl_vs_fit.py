"""Reproduces tensorflow/tensorflow#36530 (custom loop much slower than fit under the strategy).

Thread: https://github.com/tensorflow/tensorflow/issues/36530 — the same ResNet50 on
images resized to 224x224, trained with MirroredStrategy on up to 8 GPUs: Keras ``fit``
scaled, the custom training loop (``strategy.experimental_run_v2`` in a ``tf.function``)
took far longer ("varies greatly"). The thread closed pointing to the GPU performance
guide and the profiler, without a stated cause ("unresolved"; cause class 5).

Mechanism (cause 5, a custom training loop): a tutorial-style loop — a ``tf.function``
around ``strategy.run``, a ``map`` that resizes images in the input pipeline, the loss
and an accuracy metric read on the host every step. Our ``fit`` callbacks cannot see this
loop: the script writes NO ``keras_dp/`` records today, only its step times
(``--training-loop`` measures it with ``kdt.TrainingLoop``).

Usage: python repro_tf36530_ctl_vs_fit.py --log-dir runs/tf36530 [--training-loop]
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
rng = np.random.default_rng(11)
images = rng.integers(0, 255, size=(global_batch * 6, 32, 32, 3)).astype("uint8")
labels = rng.integers(0, 10, size=(global_batch * 6,))


def resize(image, label):
    return tf.image.resize(image, [48, 48]) / 255.0, label


dataset = (
    tf.data.Dataset.from_tensor_slices((images, labels)).map(resize).repeat().batch(global_batch)
)
dist_dataset = strategy.experimental_distribute_dataset(dataset)

with strategy.scope():
    inputs = keras.Input((48, 48, 3))
    x = keras.layers.Conv2D(32, 3, strides=2, activation="relu")(inputs)
    for _ in range(2):
        shortcut = x
        x = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(x)
        x = keras.layers.Conv2D(32, 3, padding="same")(x)
        x = keras.layers.Activation("relu")(keras.layers.Add()([x, shortcut]))
    outputs = keras.layers.Dense(10)(keras.layers.GlobalAveragePooling2D()(x))
    model = keras.Model(inputs, outputs)
    optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    optimizer.build(model.trainable_variables)  # slots before tf.function, not in it
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    accuracy = keras.metrics.SparseCategoricalAccuracy()


def replica_step(x, y):
    with tf.GradientTape() as tape:
        logits = model(x, training=True)
        loss = tf.nn.compute_average_loss(loss_fn(y, logits), global_batch_size=global_batch)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    accuracy.update_state(y, logits)
    return loss


@tf.function
def train_step(batch):
    losses = strategy.run(replica_step, args=batch)
    return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)


step_seconds = []
iterator = iter(dist_dataset)
# --training-loop: kdt.TrainingLoop measures the steps (a window over steps 5-9).
with _corpus.training_loop(run, model, global_batch=global_batch) as loop:
    for _step in range(40):
        began = time.perf_counter()
        with loop.step():
            loss = float(train_step(next(iterator)))
            acc = float(accuracy.result())  # read on the host every step, as the tutorial
        step_seconds.append(time.perf_counter() - began)
print("median step ms:", 1000 * float(np.median(step_seconds[5:])), "loss", loss, "acc", acc)
_corpus.save_loop_times(run, step_seconds)
