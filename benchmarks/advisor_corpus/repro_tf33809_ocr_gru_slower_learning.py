"""Reproduces tensorflow/tensorflow#33809 (MirroredStrategy slower and much weaker learning).

Thread: https://github.com/tensorflow/tensorflow/issues/33809 — an OCR model (Conv2D
feature extraction, then GRU layers) on two GPUs under MirroredStrategy: 115-133 ms a
step and a loss far above the OneDeviceStrategy run. The log shows the implementation
selector failing for the GRU: "Functions '__inference_standard_gru_...' and
'__inference_cudnn_gru_with_fallback_..._specialized_for_replica_1...' both implement
'gru_...' but their signatures do not match", i.e. the replicas' GRU could not be swapped
to cuDNN. The maintainers also pointed to strong versus weak scaling for the learning.

Mechanism (cause 6, kernels slower under the strategy): the GRU runs a slower kernel
under the multi-replica strategy (emulated by ``_corpus.strategy_dependent_gru``), so
compute per example rises with replicas at one per-replica batch. ``run_all.py`` runs it
with 1 and with 4 replicas.

Usage: python repro_tf33809_ocr_gru_slower_learning.py --log-dir runs/tf33809/r4 --replicas 4
"""

import _corpus

run = _corpus.start(__doc__)
import keras  # noqa: E402
import numpy as np  # noqa: E402

PER_REPLICA = 8
global_batch = PER_REPLICA * run.strategy.num_replicas_in_sync
rng = np.random.default_rng(15)
images = rng.random((global_batch * 25, 16, 64, 1), dtype=np.float32)  # text lines
targets = rng.integers(0, 20, size=(global_batch * 25,))

with run.strategy.scope():
    inputs = keras.Input((16, 64, 1))
    x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inputs)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(x)
    x = keras.layers.MaxPooling2D()(x)  # (4, 16, 16)
    x = keras.layers.Permute((2, 1, 3))(x)  # width becomes time
    x = keras.layers.Reshape((16, 64))(x)
    x = _corpus.strategy_dependent_gru(48, name="gru")(x)
    outputs = keras.layers.Dense(20)(x)
    model = keras.Model(inputs, outputs)
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )

model.fit(
    images,
    targets,
    batch_size=global_batch,
    epochs=1,
    verbose=0,
    callbacks=_corpus.fit_callbacks(run, global_batch=global_batch, per_replica_batch=PER_REPLICA),
)
