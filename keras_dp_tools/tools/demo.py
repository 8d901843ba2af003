"""The demo: a small CNN trained data-parallel on synthetic images, fully recorded.

Runs anywhere: with GPUs it mirrors over them, without it splits the CPU into
logical devices, so the all-reduces are real. No data is downloaded.
"""

from __future__ import annotations

import os
import shlex
import time
from pathlib import Path

import numpy as np

from keras_dp_tools.capture import callbacks
from keras_dp_tools.records.contract import LOG_DIR_ENV
from keras_dp_tools.report.facade import Report
from keras_dp_tools.setup.devices import configure_devices
from keras_dp_tools.setup.scaling import plan_scaling

IMAGE_SHAPE = (32, 32, 3)
CLASSES = 10


def keras_module():
    """``tf_keras`` when ``TF_USE_LEGACY_KERAS`` is set (as ``tf.keras`` does), else Keras 3."""
    if os.environ.get("TF_USE_LEGACY_KERAS", "").lower() in ("1", "true", "yes"):
        import tf_keras

        return tf_keras
    import keras

    return keras


def synthetic_images(examples: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random images labelled by a fixed random projection: learnable, no download."""
    rng = np.random.default_rng(seed)
    images = rng.normal(size=(examples, *IMAGE_SHAPE)).astype("float32")
    pooled = images.reshape(examples, 8, 4, 8, 4, 3).mean(axis=(2, 4)).reshape(examples, -1)
    labels = (pooled @ rng.normal(size=(pooled.shape[1], CLASSES))).argmax(axis=1)
    return images, labels.astype("int32")


def small_cnn(keras):
    """The demo's model: two convolutions and two dense layers over ``IMAGE_SHAPE``.

    Args:
        keras: the Keras module to build with (``keras_module()``).

    Returns:
        The model, not compiled.
    """
    layers = keras.layers
    return keras.Sequential(
        [
            keras.Input(IMAGE_SHAPE),
            layers.Conv2D(16, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.Conv2D(32, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.Flatten(),
            layers.Dense(64, activation="relu"),
            layers.Dense(CLASSES),
        ]
    )


def default_log_dir() -> Path:
    """``KERAS_DP_LOG_DIR`` (set by ``keras-dp sweep``), else ``runs/demo-<timestamp>``."""
    from_env = os.environ.get(LOG_DIR_ENV)
    return Path(from_env) if from_env else Path("runs") / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"


def run_demo(
    replicas: int | None = None,
    steps: int = 300,
    epochs: int = 3,
    per_replica_batch: int = 16,
    log_dir: str | os.PathLike | None = None,
    verbose: int | str = "auto",
) -> Report:
    """Trains the demo model and returns the ``Report`` of the run.

    Must run before anything else in the process initialises TensorFlow's devices
    (``configure_devices`` splits the CPU). ``steps`` are spread over ``epochs``.

    Args:
        replicas: logical devices to split the CPU into (None: the GPUs, or 4).
        steps: training steps in all.
        epochs: epochs to spread them over.
        per_replica_batch: examples per replica and step.
        log_dir: the run folder (default: ``runs/demo-<timestamp>``).
        verbose: Keras's ``fit`` verbosity.

    Returns:
        The ``Report`` of the run.

    Raises:
        ValueError: fewer steps than epochs.

    Example:

    ```python
    from keras_dp_tools.tools.demo import run_demo

    print(run_demo(steps=60, epochs=2).text())  # what `keras-dp demo` does
    ```
    """
    if steps < epochs:
        raise ValueError(f"steps ({steps}) must be at least epochs ({epochs}).")
    log_dir = Path(log_dir) if log_dir is not None else default_log_dir()
    devices = configure_devices(replicas)

    import tensorflow as tf

    keras = keras_module()
    strategy = tf.distribute.MirroredStrategy(devices)
    # Adam at 1e-3 was tuned for 64 examples per step (4 replicas x 16): scale with sqrt.
    plan = plan_scaling(strategy, per_replica_batch, base_lr=1e-3, base_batch=64, rule="sqrt")
    global_batch = plan.global_batch
    images, labels = synthetic_images(max(1024, 4 * global_batch))
    dataset = (
        tf.data.Dataset.from_tensor_slices((images, labels))
        .shuffle(len(images), seed=0)
        .repeat()
        .batch(global_batch, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )
    with strategy.scope():
        model = small_cnn(keras)
        model.compile(
            optimizer=keras.optimizers.Adam(plan.target_lr),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    print(
        f"keras_dp_tools demo: {strategy.num_replicas_in_sync} replicas on "
        f"{', '.join(devices)}, global batch {global_batch} ({per_replica_batch} per replica), "
        f"{steps} steps, {keras.__name__} {keras.__version__}, log dir {log_dir}",
        flush=True,
    )
    model.fit(
        dataset,
        epochs=epochs,
        shuffle=False,  # the dataset shuffles; Keras would only warn that it ignores this
        steps_per_epoch=-(-steps // epochs),
        verbose=verbose,
        callbacks=[
            # Three profiler windows spread over the run.
            *callbacks(
                log_dir,
                global_batch=global_batch,
                profile_every=max(steps // 3, 5),
                dataset=dataset,
                per_replica_batch=per_replica_batch,
                plan=plan,
            ),
            keras.callbacks.TensorBoard(str(log_dir)),
        ],
    )
    return Report.load(log_dir)


def notebook_hint(log_dir: os.PathLike | str, notebook: os.PathLike | str) -> str:
    """The command that opens the report notebook on ``log_dir``. The log dir is made
    absolute (a ``<placeholder>`` is kept): Jupyter starts the kernel in the notebook's
    folder, where a relative path would name another folder."""
    shown = str(log_dir) if str(log_dir).startswith("<") else str(Path(log_dir).resolve())
    return f"{LOG_DIR_ENV}={shlex.quote(shown)} jupyter lab {shlex.quote(str(notebook))}"


def print_next_steps(report: Report, log_dir: os.PathLike) -> None:
    """Prints the run's report and the commands to look further (TensorBoard, the
    HTML report, the notebook).

    Args:
        report: the demo run's ``Report``.
        log_dir: its run folder.
    """
    print()
    print(report.text())
    print(
        "\nNext:\n"
        f"  tensorboard --logdir {log_dir}      (Data parallel tab, scalars, Profile tab)\n"
        f"  keras-dp analyze {log_dir}          (per-step compute / all-reduce breakdown)\n"
        f"  keras-dp report {log_dir} --html report.html\n"
        f"  keras-dp notebook && {notebook_hint(log_dir, 'report.ipynb')}\n"
        "      (the report notebook on this run: `keras-dp notebook` writes report.ipynb "
        "here; pip install jupyterlab)"
    )
