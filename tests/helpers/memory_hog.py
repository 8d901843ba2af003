"""A model whose training memory grows by a known amount per example, for the batch
finder's trials (imported in their processes as ``tests.helpers.memory_hog:...``)."""

FEATURES = 1024 * 1024  # 4 MiB of float32 per example


def build_model():
    import keras

    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    return model


def make_dataset(global_batch):
    import tensorflow as tf

    x = tf.random.normal((global_batch, FEATURES))
    return tf.data.Dataset.from_tensors((x, tf.zeros((global_batch, 1)))).repeat()
