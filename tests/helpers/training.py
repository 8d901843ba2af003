"""Small models and data for tests that really train (4 logical CPU devices)."""

import numpy as np

GLOBAL_BATCH = 32


def dense_model(keras, strategy, steps_per_execution=1):
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)]
        )
        model.compile(optimizer="adam", loss="mse", steps_per_execution=steps_per_execution)
    return model


def regression_data(examples=GLOBAL_BATCH * 7):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(examples, 8)).astype("float32")
    return x, x.sum(axis=1, keepdims=True)


def fit(model, callbacks, epochs=1):
    """Fits 7 steps per epoch; returns the History."""
    x, y = regression_data()
    return model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=epochs, verbose=0, callbacks=callbacks)


def iterations(model) -> int:
    return int(np.asarray(model.optimizer.iterations))
