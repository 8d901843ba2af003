"""What a run header says about the training setup, read off the model being fit."""

from __future__ import annotations

import logging
import os
import platform
import socket
import sys

import numpy as np

logger = logging.getLogger("keras_dp_tools")


def keras_package(model) -> str:
    """``"keras"`` (Keras 3) or ``"tf_keras"`` (legacy), from the model's own class."""
    return type(model).__module__.split(".", 1)[0]


def worker_index(strategy) -> tuple[int, int]:
    """(this worker's index, number of workers) of a strategy.

    Single-process strategies are worker 0 of 1. Under a multi-worker strategy the
    chief, if the cluster has one, is worker 0 and the workers follow it.
    """
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type:
        return 0, 1
    cluster = resolver.cluster_spec().as_dict()
    chiefs = len(cluster.get("chief", []))
    workers = chiefs + len(cluster.get("worker", []))
    if resolver.task_type == "chief":
        return 0, workers
    return chiefs + int(resolver.task_id), workers


def strategy_devices(strategy) -> list[str]:
    try:
        return [str(device) for device in strategy.extended.worker_devices]
    except (AttributeError, RuntimeError, ValueError):
        return []


def steps_per_execution(model) -> int:
    value = getattr(model, "steps_per_execution", None)
    if value is None:
        value = getattr(model, "_steps_per_execution", None)  # tf_keras keeps a variable
    try:
        return int(np.asarray(value)) if value is not None else 1
    except (TypeError, ValueError):
        return 1


def global_step(model) -> int | None:
    """``optimizer.iterations``: steps the optimizer has applied, or None if unreadable."""
    try:
        return int(np.asarray(model.optimizer.iterations))
    except Exception as error:  # a model without optimizer state; we count from 0
        logger.info("could not read optimizer.iterations (%s); counting steps from 0", error)
        return None


def embedding_layers(model) -> int:
    """Embedding layers in the model: their gradients are IndexedSlices, which
    all-reduce poorly (see the advisor)."""
    try:
        layers = model._flatten_layers(include_self=False)  # Keras 3 and tf_keras
        return sum(1 for layer in layers if "Embedding" in type(layer).__name__)
    except Exception as error:  # a model class without the private walker
        logger.info("could not list the model's layers (%s)", error)
        return 0


def describe_run(model, global_batch: int | None) -> dict:
    """Header fields for a run training ``model`` (see docs/records.md); the recorder adds
    ``run``, ``worker`` and ``time``."""
    import tensorflow as tf

    import keras_dp_tools

    strategy = model.distribute_strategy
    package = keras_package(model)
    return {
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "strategy": type(strategy).__name__,
        "replicas": int(strategy.num_replicas_in_sync),
        "workers": worker_index(strategy)[1],
        "devices": strategy_devices(strategy),
        "global_batch": global_batch,
        "steps_per_execution": steps_per_execution(model),
        "keras_package": package,
        "keras_version": getattr(sys.modules.get(package), "__version__", None),
        "tf_version": tf.__version__,
        "python_version": platform.python_version(),
        "keras_dp_tools_version": keras_dp_tools.__version__,
        "embedding_layers": embedding_layers(model),
    }


def gradient_bytes(model) -> int | None:
    """Bytes of the trainable variables: what each replica all-reduces per step."""
    try:
        total = 0
        for variable in model.trainable_variables:
            dtype = variable.dtype
            itemsize = getattr(dtype, "size", None) or np.dtype(dtype).itemsize
            total += int(np.prod(variable.shape)) * itemsize
        return total
    except Exception as error:  # exotic variables; bandwidths stay empty
        logger.info("could not size the trainable variables (%s)", error)
        return None


def keras3_multiworker_problem(model) -> str | None:
    """Why this fit is expected to fail, when a Keras 3 model trains under
    MultiWorkerMirroredStrategy (keras-team/keras#20585), else None."""
    import tensorflow as tf

    strategy = getattr(model, "distribute_strategy", None)
    multi_worker = isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
    if keras_package(model) != "keras" or not multi_worker:
        return None
    return (
        "Keras 3 fit fails under MultiWorkerMirroredStrategy with more than one worker "
        '("Attempt to convert a value (PerReplica...)", keras-team/keras#20585, '
        "tensorflow/tensorflow#72388). Train with "
        "legacy tf_keras instead: pip install tf-keras (or keras_dp_tools[multiworker]), "
        "set TF_USE_LEGACY_KERAS=1 before importing TensorFlow, and import tf_keras as "
        "keras; keras_dp_tools callbacks work with both."
    )
