"""Reproduces tensorflow/tensorflow#103564 (MirroredStrategy overheads vs a standalone run).

Thread: https://github.com/tensorflow/tensorflow/issues/103564 — TF 2.19, a small dense
network (a hidden-layer width and the batch size given on the command line, arrays or a
``tf.data`` dataset) trained in K-fold cross-validation (``KFold``) with
``EarlyStopping``; under MirroredStrategy training incurred "a lot of overheads" compared
with a standalone instance. Open, no maintainer diagnosis ("unresolved").

Mechanism reproduced (cause 3, time outside the steps; our reading of the setup): each
fold calls ``fit`` again on a new model, with validation every epoch and short epochs;
under the strategy every ``fit`` traces and distributes its functions again and every
epoch runs a distributed evaluation, so much of the wall time lies outside the training
steps. The records of all folds go to one log dir; only the first fold is profiled.

Usage: python repro_tf103564_kfold_fit_overheads.py --log-dir runs/tf103564
"""

import _corpus

run = _corpus.start(__doc__)
import keras  # noqa: E402
import numpy as np  # noqa: E402

BATCH_SIZE = 256
HIDDEN = 64
FOLDS = 2
rng = np.random.default_rng(16)
x = rng.normal(size=(1536, 20)).astype("float32")
y = (x @ rng.normal(size=(20, 1))).astype("float32")
fold_of = np.arange(len(x)) % FOLDS

for fold in range(FOLDS):
    train, valid = fold_of != fold, fold_of == fold
    with run.strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((20,)),
                keras.layers.Dense(HIDDEN, activation="relu"),
                keras.layers.Dense(HIDDEN, activation="relu"),
                keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer="adam", loss="mse")
    model.fit(
        x[train],
        y[train],
        batch_size=BATCH_SIZE,
        epochs=3,
        validation_data=(x[valid], y[valid]),
        verbose=0,
        callbacks=[
            keras.callbacks.EarlyStopping(patience=3, restore_best_weights=True),
            *_corpus.fit_callbacks(
                run,
                global_batch=BATCH_SIZE,
                profile=fold == 0,  # one profiler window (fold 0) keeps the run short
                profile_start_step=2,
            ),
        ],
    )
