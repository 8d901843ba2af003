"""Reproduces IsoNet-cryoET/IsoNet#36 ("fix bug in multi-GPU training").

Thread: https://github.com/IsoNet-cryoET/IsoNet/pull/36 — a pull request fixing
multi-GPU training of a Keras U-Net under MirroredStrategy; the reviewer's summary of the
fix: "put model.compile within strategy.scope".

Mechanism (cause 4, no data parallelism): the strategy is created (4 logical devices
here), but the model is built and compiled outside ``strategy.scope()``. Its variables
are ordinary, not mirrored, and ``fit`` trains on the default strategy with one replica:
the global batch of 64 runs on one device while three sit idle. (The PR's code compiled
outside the scope; building outside too is the form the issue reports for Keras 3.)

Usage: python repro_isonet36_compile_outside_scope.py --log-dir runs/isonet36
"""

import _corpus

run = _corpus.start(__doc__)
import keras  # noqa: E402
import numpy as np  # noqa: E402

PER_REPLICA = 16
global_batch = PER_REPLICA * run.strategy.num_replicas_in_sync  # sized for 4 replicas
rng = np.random.default_rng(12)
volumes = rng.random((global_batch * 12, 24, 24, 1), dtype=np.float32)
targets = volumes + 0.1 * rng.normal(size=volumes.shape).astype("float32")

# The bug: no `with run.strategy.scope():` around building and compiling.
inputs = keras.Input((24, 24, 1))
down = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inputs)
pooled = keras.layers.MaxPooling2D()(down)
mid = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(pooled)
up = keras.layers.UpSampling2D()(mid)
merged = keras.layers.Concatenate()([up, down])
outputs = keras.layers.Conv2D(1, 3, padding="same")(merged)
model = keras.Model(inputs, outputs)
model.compile(optimizer="adam", loss="mse")

model.fit(
    volumes,
    targets,
    batch_size=global_batch,
    epochs=2,
    verbose=0,
    callbacks=_corpus.fit_callbacks(run, global_batch=global_batch, per_replica_batch=PER_REPLICA),
)
