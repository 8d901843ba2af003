"""Reproduces tensorflow/tensorflow#26392 (MirroredStrategy, no speed-up for a small DNN).

Thread: https://github.com/tensorflow/tensorflow/issues/26392 — an Estimator with a
simple DNN (layers 256 -> 128 -> 64) trained no faster on several GPUs than on one, even
with a batch of 1024. The maintainer answered that ~90% scaling is expected and asked to
check the measurement; the thread closed without a cause ("unresolved").

Mechanism reproduced (cause 1, too little work per step, our reading of the setup): a
three-layer MLP on 32 dense features does little arithmetic per example, so even at 128
examples per replica the step is short and its fixed costs (dispatch, the all-reduce of
the weights' gradients, host work) take much of it. Keras ``fit`` stands in for the
Estimator.

Usage: python repro_tf26392_small_dnn.py --log-dir runs/tf26392
"""

import _corpus

run = _corpus.start(__doc__)
import keras  # noqa: E402
import numpy as np  # noqa: E402

GLOBAL_BATCH = 512
rng = np.random.default_rng(2)
x = rng.normal(size=(GLOBAL_BATCH * 40, 32)).astype("float32")
y = (x[:, :4].sum(axis=1) > 0).astype("float32")

with run.strategy.scope():
    model = keras.Sequential(
        [
            keras.Input((32,)),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(1, activation="sigmoid"),
        ]
    )
    model.compile(optimizer="adagrad", loss="binary_crossentropy")

model.fit(
    x,
    y,
    batch_size=GLOBAL_BATCH,
    epochs=2,
    verbose=0,
    callbacks=_corpus.fit_callbacks(run, global_batch=GLOBAL_BATCH),
)
