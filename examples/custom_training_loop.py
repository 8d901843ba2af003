"""Measure a custom training loop (``strategy.run`` inside a ``tf.function``) as ``fit``.

    python examples/custom_training_loop.py [LOG_DIR] [--tf-keras] [--eager] [--steps N]

``--tf-keras`` trains with legacy tf_keras (``TF_USE_LEGACY_KERAS=1``, set here before
TensorFlow is imported); ``--eager`` leaves out the ``tf.function``, which makes the
replicas run one after another: the advice then reports it as an error. Runs on GPUs if
there are any, else on the CPU split into 2 logical devices, in seconds.
"""

import argparse
import os

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("log_dir", nargs="?", default="runs/custom_training_loop")
parser.add_argument("--tf-keras", action="store_true", help="train with legacy tf_keras")
parser.add_argument("--eager", action="store_true", help="no tf.function (the mistake)")
parser.add_argument("--steps", type=int, default=30, help="steps to train")
options = parser.parse_args()
if options.tf_keras:
    os.environ["TF_USE_LEGACY_KERAS"] = "1"  # before TensorFlow is imported

import keras_dp_tools as kdt  # noqa: E402

devices = kdt.configure_devices(2)  # first thing: may split the CPU into logical devices

import tensorflow as tf  # noqa: E402

if options.tf_keras:
    import tf_keras as keras
else:
    import keras

strategy = tf.distribute.MirroredStrategy(devices)
global_batch = kdt.scale_batch_size(32, strategy)  # 32 examples per replica
with strategy.scope():  # variables mirrored on every replica
    model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(64), keras.layers.Dense(1)])
    # 0.01 suits one replica's 32 examples: scaled with the global batch.
    optimizer = keras.optimizers.SGD(kdt.scale_learning_rate(0.01, global_batch, base_batch=32))

features = tf.random.stateless_normal((global_batch * options.steps, 20), seed=(0, 1))
targets = tf.reduce_sum(features, axis=1, keepdims=True)
dataset = tf.data.Dataset.from_tensor_slices((features, targets)).batch(global_batch)
batches = strategy.experimental_distribute_dataset(dataset)


def replica_step(x, y):
    with tf.GradientTape() as tape:
        per_example = keras.losses.mean_squared_error(y, model(x, training=True))
        loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
    return loss


def distributed_step(x, y):
    losses = strategy.run(replica_step, args=(x, y))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)


train_step = distributed_step if options.eager else tf.function(distributed_step)

with kdt.TrainingLoop(
    options.log_dir,
    strategy,
    model,
    global_batch=global_batch,
    profile_start_step=10,
    monitor=False,
) as loop:
    for x, y in batches:
        with loop.step():
            loss = train_step(x, y)

print(f"{loop.step_function()} steps, last loss {float(loss):.3f}")
report = kdt.Report.load(options.log_dir)
print(report.summary().T.to_string())
