"""Reproduces tensorflow/tensorflow#40421 (MirroredStrategy preventing the cuDNN GRU).

Thread: https://github.com/tensorflow/tensorflow/issues/40421 — "The cuDNN
implementation of GRU is not being used when the model is built and compiled within
``tf.distribute.MirroredStrategy``. The same model built without a strategy does use the
cuDNN GRU implementation." (TF 2.2, a T4; labelled a feature request, never fixed there.)

Mechanism (cause 6, kernels slower under the strategy): the recurrent layer runs a
slower kernel under a multi-replica strategy, so the compute per example rises from 1 to
N replicas at the same per-replica batch. Emulated on the CPU by
``_corpus.strategy_dependent_gru`` (generic per-time-step GRU when replicas > 1).
Diagnosing it needs two runs at one per-replica batch: ``run_all.py`` runs this script
with 1 and with 4 replicas (``--replicas``).

Usage: python repro_tf40421_gru_kernel_fallback.py --log-dir runs/tf40421/r4 --replicas 4
"""

import _corpus

run = _corpus.start(__doc__)
import keras  # noqa: E402
import numpy as np  # noqa: E402

PER_REPLICA = 16
global_batch = PER_REPLICA * run.strategy.num_replicas_in_sync
rng = np.random.default_rng(14)
x = rng.random((global_batch * 30, 32, 16), dtype=np.float32)
y = rng.random((global_batch * 30, 1), dtype=np.float32)

with run.strategy.scope():
    model = keras.Sequential(
        [
            keras.Input((32, 16)),
            _corpus.strategy_dependent_gru(64, name="gru"),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer="adam", loss="mse")

model.fit(
    x,
    y,
    batch_size=global_batch,
    epochs=1,
    verbose=0,
    callbacks=_corpus.fit_callbacks(run, global_batch=global_batch, per_replica_batch=PER_REPLICA),
)
