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


def _integer(value) -> int | None:
    """An int from a Python number or a (mirrored) variable. Inside ``fit`` under a
    strategy, ``np.asarray`` of a MirroredVariable fails ("__array__ method not
    producing an array"), which once made every tf_keras run report
    ``steps_per_execution: 1``; ``.numpy()`` reads it."""
    if value is None:
        return None
    read = getattr(value, "numpy", None)
    try:
        return int(read() if callable(read) else np.asarray(value))
    except (TypeError, ValueError, AttributeError):
        return None


def steps_per_execution(model) -> int:
    value = getattr(model, "steps_per_execution", None)
    if value is None:
        value = getattr(model, "_steps_per_execution", None)  # tf_keras keeps a variable
    return _integer(value) or 1


def global_step(model) -> int | None:
    """``optimizer.iterations``: steps the optimizer has applied, or None if unreadable."""
    try:
        return int(np.asarray(model.optimizer.iterations))
    except Exception as error:  # a model without optimizer state; we count from 0
        logger.info("could not read optimizer.iterations (%s); counting steps from 0", error)
        return None


def _embeddings(model) -> list:
    try:
        layers = model._flatten_layers(include_self=False)  # Keras 3 and tf_keras
        return [layer for layer in layers if "Embedding" in type(layer).__name__]
    except Exception as error:  # a model class without the private walker
        logger.info("could not list the model's layers (%s)", error)
        return []


def embedding_layers(model) -> int:
    """Embedding layers in the model: their gradients are IndexedSlices, which
    TF 2.21 all-gathers instead of all-reducing (see the advisor)."""
    return len(_embeddings(model))


def _itemsize(dtype) -> int:
    return getattr(dtype, "size", None) or np.dtype(getattr(dtype, "name", dtype)).itemsize


def embedding_tables(model) -> list[dict]:
    """Per embedding layer: ``name``, ``vocabulary``, ``dim``, ``value_bytes`` (bytes
    per table entry), ``table_bytes``,
    ``lookups`` (table rows looked up per example: the product of the layer's input
    shape without the batch; None if unknown) and ``index_bytes`` (bytes per index)."""
    tables = []
    for layer in _embeddings(model):
        try:
            table = layer.embeddings
            vocabulary, dim = (int(size) for size in table.shape)
            entry = {
                "name": layer.name,
                "vocabulary": vocabulary,
                "dim": dim,
                "value_bytes": _itemsize(table.dtype),
                "table_bytes": vocabulary * dim * _itemsize(table.dtype),
                "lookups": None,
                "index_bytes": 8,
            }
            shape = tuple(layer.input.shape)[1:]
            if all(size is not None for size in shape):
                entry["lookups"] = int(np.prod(shape, dtype=np.int64))
            entry["index_bytes"] = 4 if "int32" in str(layer.input.dtype) else 8
        except Exception as error:  # an unbuilt or unusual layer: bytes stay unknown
            logger.info("could not size embedding layer %s (%s)", layer.name, error)
        else:
            tables.append(entry)
    return tables


def gathered_bytes(tables: list[dict], global_batch: int | None) -> int | None:
    """Bytes one step all-gathers for the embeddings' sparse gradients: one row of
    values (``dim`` floats) and one index per lookup, for the whole global batch.
    None when the batch or a layer's lookups per example are unknown."""
    if not tables or not global_batch or any(t["lookups"] is None for t in tables):
        return None
    return sum(
        global_batch * t["lookups"] * (t["dim"] * t["value_bytes"] + t["index_bytes"])
        for t in tables
    )


def fit_global_batch() -> int | None:
    """The batch size of the ``fit`` that is calling us, read off its frame: the
    ``batch_size`` argument, else the data adapter's (Keras 3 ``epoch_iterator``,
    tf_keras ``data_handler``). None when neither says."""
    frame = sys._getframe(1)
    for _ in range(25):
        if frame is None:
            return None
        if frame.f_code.co_name == "fit" and "batch_size" in frame.f_locals:
            local = frame.f_locals
            candidates = [
                local.get("batch_size"),
                getattr(
                    getattr(local.get("epoch_iterator"), "data_adapter", None), "batch_size", None
                ),
                getattr(getattr(local.get("data_handler"), "_adapter", None), "batch_size", None),
            ]
            for value in candidates:
                value = value() if callable(value) else value
                if isinstance(value, (int, np.integer)) and value > 0:
                    return int(value)
            return None
        frame = frame.f_back
    return None


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
        "embedding_names": [
            f"{t['name']} ({t['vocabulary']}x{t['dim']})" for t in embedding_tables(model)
        ],
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
