"""What a run header says about the training setup, read off the model being fit."""

from __future__ import annotations

import logging
import os
import platform
import socket
import sys
import weakref

import numpy as np

from keras_dp_tools.capture.base import DataParallelCallback, find_in_fit, keras_package
from keras_dp_tools.capture.input_pipeline import describe_adapter
from keras_dp_tools.checks.batching import walk_batch
from keras_dp_tools.common.warn import warn

logger = logging.getLogger("keras_dp_tools")


def worker_index(strategy) -> tuple[int, int]:
    """(this worker's index, number of workers) of a strategy.

    Single-process strategies are worker 0 of 1. Under a multi-worker strategy the
    chief, if the cluster has one, is worker 0 and the workers follow it.

    Args:
        strategy: a ``tf.distribute`` strategy.

    Returns:
        ``(index, workers)``.
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
    """This worker's devices of a strategy, as names.

    Args:
        strategy: a ``tf.distribute`` strategy.

    Returns:
        Its worker devices in replica order; [] where the strategy does not say.
    """
    try:
        return [str(device) for device in strategy.extended.worker_devices]
    except (AttributeError, RuntimeError, ValueError):
        return []


def _integer(value) -> int | None:
    """An int from a Python number or a (mirrored) variable. Inside ``fit`` under a
    strategy, ``np.asarray`` of a MirroredVariable fails ("__array__ method not
    producing an array"); ``.numpy()`` reads it."""
    if value is None:
        return None
    read = getattr(value, "numpy", None)
    try:
        return int(read() if callable(read) else np.asarray(value))
    except (TypeError, ValueError, AttributeError):
        return None


def steps_per_execution(model) -> int:
    """Steps each train-function call runs.

    Args:
        model: the Keras model being fit (Keras 3 or tf_keras).

    Returns:
        ``steps_per_execution`` as an int; 1 where it cannot be read.
    """
    value = getattr(model, "steps_per_execution", None)
    if value is None:
        value = getattr(model, "_steps_per_execution", None)  # tf_keras keeps a variable
    return _integer(value) or 1


def global_step(model) -> int | None:
    """Steps the optimizer has applied (``optimizer.iterations``).

    Args:
        model: the Keras model being fit.

    Returns:
        The count, or None where it cannot be read (we then count from 0).
    """
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
    TF 2.21 all-gathers instead of all-reducing (see the advisor).

    Args:
        model: a Keras model.

    Returns:
        How many layers of the model are embeddings.
    """
    return len(_embeddings(model))


def _itemsize(dtype) -> int:
    return getattr(dtype, "size", None) or np.dtype(getattr(dtype, "name", dtype)).itemsize


def _embedding_input(layer, model) -> tuple[tuple | None, bool, str | None]:
    """(input shape, whether its first dimension is the batch, dtype name or None).

    ``layer.input`` exists only for a layer of a functional graph; a layer called
    inside another layer (a token-and-position embedding) or in a subclassed model has
    none, but both Keras flavours keep the shape it was built with. A built shape whose
    first dimension is unknown is batch-first; a fully known one is taken as what every
    replica looks up per step (e.g. position ids ``range(64)``)."""
    try:
        tensor = layer.input
        return tuple(tensor.shape), True, str(tensor.dtype)
    except (AttributeError, ValueError, RuntimeError):
        pass
    built = getattr(layer, "_build_shapes_dict", None) or {}  # Keras 3
    shape = next(iter(built.values()), None) or getattr(layer, "_build_input_shape", None)
    if shape is None:
        return None, True, None
    shape = tuple(getattr(shape, "as_list", lambda: shape)())
    inputs = getattr(model, "inputs", None) or []
    # The model's token input usually reaches the embedding unchanged.
    dtype = str(inputs[0].dtype) if len(inputs) == 1 else None
    return shape, not shape or shape[0] is None, dtype


def embedding_tables(model) -> list[dict]:
    """Per embedding layer: ``name``, ``vocabulary``, ``dim``, ``value_bytes`` (bytes
    per table entry), ``table_bytes``, ``lookups`` (table rows looked up per example:
    the product of the layer's input shape without the batch), ``step_lookups`` (rows
    each replica looks up per step whatever the batch, for an input without a batch
    dimension such as position ids; else 0), both None if unknown, and
    ``index_bytes`` (bytes per index: 8 for int64 ids, else 4, as both Keras flavours
    cast other ids to int32).

    Args:
        model: a built Keras model (an unbuilt layer is left out).

    Returns:
        One dict per embedding layer, as above.
    """
    tables = []
    for layer in _embeddings(model):
        try:
            table = layer.embeddings
            vocabulary, dim = (int(size) for size in table.shape)
        except Exception as error:  # an unbuilt layer: its table is unknown
            logger.info("could not size embedding layer %s (%s)", layer.name, error)
            continue
        entry = {
            "name": layer.name,
            "vocabulary": vocabulary,
            "dim": dim,
            "value_bytes": _itemsize(table.dtype),
            "table_bytes": vocabulary * dim * _itemsize(table.dtype),
            "lookups": None,
            "step_lookups": None,
            "index_bytes": 4,
        }
        try:
            shape, batch_first, dtype = _embedding_input(layer, model)
        except Exception as error:  # an unusual layer: its lookups stay unknown
            logger.info("could not read embedding layer %s's input (%s)", layer.name, error)
            shape, batch_first, dtype = None, True, None
        sizes = (shape or (None,))[1:] if batch_first else shape
        if shape is not None and all(size is not None for size in sizes):
            count = int(np.prod(sizes, dtype=np.int64))
            entry["lookups"], entry["step_lookups"] = (count, 0) if batch_first else (0, count)
        if dtype is not None and "int64" in dtype:
            entry["index_bytes"] = 8
        tables.append(entry)
    return tables


def gathered_bytes(
    tables: list[dict], global_batch: int | None, replicas: int | None = None
) -> int | None:
    """Bytes one step all-gathers for the embeddings' sparse gradients: one row of
    values (``dim`` floats) and one index per lookup, for the whole global batch (and
    each replica's ``step_lookups``).

    Args:
        tables: ``embedding_tables`` of the model.
        global_batch: examples per step over all replicas.
        replicas: replicas in sync (needed only for ``step_lookups``).

    Returns:
        The bytes; None when the batch, the replicas (if needed) or a layer's lookups
        are unknown.

    Example:

    >>> from keras_dp_tools.capture.run_info import gathered_bytes
    >>> table = {"lookups": 20, "step_lookups": 0, "dim": 64, "value_bytes": 4,
    ...          "index_bytes": 4}
    >>> gathered_bytes([table], global_batch=128)  # 128 x 20 rows of (256 + 4) bytes
    665600
    """
    if not tables or not global_batch or any(t["lookups"] is None for t in tables):
        return None
    if any(t.get("step_lookups") for t in tables) and not replicas:
        return None
    return sum(
        (global_batch * t["lookups"] + (replicas or 0) * (t.get("step_lookups") or 0))
        * (t["dim"] * t["value_bytes"] + t["index_bytes"])
        for t in tables
    )


# Where a run's global batch came from (the header's ``global_batch_source``).
BATCH_FROM_ARGUMENT = "argument"  # global_batch= given to StepTimer / kdt.callbacks
BATCH_FROM_FIT = "fit_batch_size"  # arrays that fit batches by batch_size (default 32)
BATCH_FROM_SHAPE = "dataset_shape"  # the dataset's static leading dimension
BATCH_FROM_BATCH_OP = "dataset_batch_op"  # the batch op of the dataset's pipeline
BATCH_FROM_REPLICAS = "per_replica_batch_x_replicas"  # distribute_datasets_from_function
UNKNOWN_BATCH = "unknown"  # "unknown: <why>"

# fit's data adapter and what it said: a fit's callbacks each ask, the answer is per fit.
_last_read: tuple = (None, None)


def _fit_data(frame_locals):
    """fit's locals (Keras 3's or tf_keras's), recognised by their data handler."""
    if "batch_size" in frame_locals and (
        "epoch_iterator" in frame_locals or "data_handler" in frame_locals
    ):
        return frame_locals
    return None


def _adapter(fit_locals):
    adapter = getattr(fit_locals.get("epoch_iterator"), "data_adapter", None)  # Keras 3
    if adapter is None:
        adapter = getattr(fit_locals.get("data_handler"), "_adapter", None)  # tf_keras
    return adapter


def fit_data_adapter():
    """The data adapter of the ``fit`` calling us (Keras 3's or tf_keras's); None when
    not called from inside ``fit`` or the adapter is not where these versions keep it."""
    fit_locals = find_in_fit(_fit_data, depth=25)
    return _adapter(fit_locals) if fit_locals is not None else None


def _dataset_global_batch(dataset) -> tuple[int | None, str]:
    """(batch, source) of a ``tf.data.Dataset``, read without consuming it: the static
    leading dimension (``batch(n, drop_remainder=True)``), else the size its batch op
    makes (every batch but a smaller last one)."""
    import tensorflow as tf

    first = tf.nest.flatten(dataset.element_spec)[0]
    shape = getattr(first, "shape", None)
    if shape is not None and shape.rank and shape[0] is not None:
        return int(shape[0]), BATCH_FROM_SHAPE
    batch, found = walk_batch(dataset)  # no data read, no graph serialized
    size = batch.size if batch is not None else None
    if batch is not None and size is None:  # an unbatch or a plain source came first
        found = f"its pipeline reaches a {found} before any batch op"
    if size is None:
        return None, (
            f"{UNKNOWN_BATCH}: fit's dataset has no static batch size, and {found}; "
            "pass global_batch="
        )
    return size, BATCH_FROM_BATCH_OP


def _adapter_value(adapter, name: str):
    """An adapter's property (Keras 3) or method (tf_keras); None if it has none."""
    try:
        value = getattr(adapter, name, None)
        return value() if callable(value) else value
    except (NotImplementedError, AttributeError, TypeError, ValueError):
        return None


def _read_fit_batch(fit_locals) -> tuple[int | None, str]:
    import tensorflow as tf

    adapter = _adapter(fit_locals)
    given = fit_locals.get("batch_size")
    if adapter is None:
        if isinstance(given, (int, np.integer)) and given > 0:
            return int(given), BATCH_FROM_FIT
        return None, f"{UNKNOWN_BATCH}: fit's data adapter was not found"
    size = _adapter_value(adapter, "batch_size")
    if isinstance(_adapter_value(adapter, "has_partial_batch"), bool) and size:
        return int(size), BATCH_FROM_FIT  # arrays, which fit batches itself
    data = getattr(adapter, "_dataset", None)
    if isinstance(data, tf.distribute.DistributedDataset):
        # experimental_distribute_dataset splits the dataset's global batches.
        original = getattr(data, "_original_dataset", None)
        if isinstance(original, tf.data.Dataset):
            return _dataset_global_batch(original)
    if "FromFunction" in type(data).__name__:
        # distribute_datasets_from_function: each element is one replica's batch.
        datasets = getattr(data, "_datasets", None) or [None]
        if isinstance(datasets[0], tf.data.Dataset):
            per_replica, source = _dataset_global_batch(datasets[0])
            if per_replica is None:
                return None, source
            replicas = int(data._strategy.num_replicas_in_sync)
            return per_replica * replicas, BATCH_FROM_REPLICAS
        return None, f"{UNKNOWN_BATCH}: the distributed dataset's per-replica datasets"
    if isinstance(data, tf.data.Dataset):
        return _dataset_global_batch(data)
    return None, (
        f"{UNKNOWN_BATCH}: fit's input ({type(adapter).__name__}) has no batch size that "
        "can be read without consuming it"
    )


def fit_global_batch() -> tuple[int | None, str]:
    """(global batch, where it came from) of the ``fit`` that is calling us, read off
    its frame without consuming data: for arrays the batch ``fit`` makes
    (``fit_batch_size``); for a ``tf.data.Dataset`` (also distributed) its static
    leading dimension (``dataset_shape``) or the size of its batch op
    (``dataset_batch_op``); for ``distribute_datasets_from_function`` the per-replica
    batch times the replicas.

    Returns:
        ``(batch, source)``; ``(None, "unknown: <why>")`` where it cannot be read.
    """
    global _last_read
    fit_locals = find_in_fit(_fit_data, depth=25)
    if fit_locals is None:
        return None, f"{UNKNOWN_BATCH}: not called from inside fit"
    adapter = _adapter(fit_locals)
    adapter_ref, answer = _last_read
    if adapter is not None and adapter_ref is not None and adapter_ref() is adapter:
        return answer
    try:
        answer = _read_fit_batch(fit_locals)
    except Exception as error:  # an adapter of another Keras version: say so, train on
        logger.info("could not read fit's batch size (%s)", error)
        answer = (None, f"{UNKNOWN_BATCH}: reading fit's input failed ({type(error).__name__})")
    try:
        _last_read = (weakref.ref(adapter), answer)
    except TypeError:  # not weakly referable (or None): read again next time
        _last_read = (None, None)
    return answer


def _shuffles_batches(adapter) -> bool:
    """Whether a tf_keras array adapter shuffles whole batches (``fit(shuffle="batch")``),
    which moves the smaller batch anywhere in the epoch. (Keras 3 shuffles within
    batch-sized chunks and keeps the smaller batch last.)"""
    inner = getattr(adapter, "_internal_adapter", None)  # ListsOfScalarsDataAdapter
    return any(
        getattr(a, "_shuffle", None) == "batch" and hasattr(a, "get_size")  # tf_keras's
        for a in (adapter, inner)
    )


def _read_last_batch(fit_locals) -> tuple[int | None, int | None, int | None]:
    import tensorflow as tf

    adapter = _adapter(fit_locals)
    if adapter is None:
        return None, None, None
    partial = _adapter_value(adapter, "has_partial_batch")
    size = _integer(_adapter_value(adapter, "batch_size"))
    if isinstance(partial, bool) and size:
        if not partial:  # arrays, which fit batches itself
            return size, None, 0
        remainder = _integer(_adapter_value(adapter, "partial_batch_size"))
        if _shuffles_batches(adapter):
            return size, None, remainder
        batches = _adapter_value(adapter, "num_batches")  # Keras 3
        if batches is None:
            batches = _adapter_value(adapter, "get_size")  # tf_keras: batches per epoch
        return size, _integer(batches), remainder
    data = getattr(adapter, "_dataset", None)
    if isinstance(data, tf.distribute.DistributedDataset):
        data = getattr(data, "_original_dataset", None)  # its global batches
    if isinstance(data, tf.data.Dataset):
        batch = walk_batch(data)[0]
        if batch is not None and batch.batched:
            return batch.size, batch.pass_batches, batch.remainder
    return None, None, None


def fit_last_batch() -> tuple[int | None, int | None, int | None]:
    """(batch, batches per pass, examples in a pass's smaller last batch) of the data of
    the ``fit`` calling us, read without consuming it; ``batch`` is the size the reading
    is about (None: none read), for the caller to check against the run's batch.
    ``(b, None, 0)`` when every batch is full (``drop_remainder=True``, the examples
    divide by the batch, an endless input); ``(b, n, r)`` when every ``n``-th step of
    the fit, counting from its first, trains on ``r`` examples: arrays batched by
    ``fit``, and datasets where nothing after the batch op reorders, drops or adds
    batches; ``n`` is None when a smaller batch may come and cannot be placed (a
    generator of unknown length, ``batch().shuffle()``, a parallel map or batch with
    ``deterministic=False``, tf_keras's ``fit(shuffle="batch")``,
    ``distribute_datasets_from_function``, ...).

    Returns:
        ``(batch, n, r)`` as above; ``(None, None, None)`` outside ``fit`` or where
        the input cannot be read.
    """
    fit_locals = find_in_fit(_fit_data, depth=25)
    if fit_locals is None:
        return None, None, None
    try:
        return _read_last_batch(fit_locals)
    except Exception as error:  # an adapter of another Keras version: say so, train on
        logger.info("could not read fit's last batch (%s)", error)
        return None, None, None


def fit_epoch_steps() -> int | None:
    """Steps per epoch of the ``fit`` calling us, when known as it begins: Keras 3's
    ``epoch_iterator.num_batches`` (``steps_per_epoch``, else the data's batches),
    tf_keras's ``data_handler.inferred_steps``.

    Returns:
        The steps, or None (a dataset of unknown length without ``steps_per_epoch``).
    """
    fit_locals = find_in_fit(_fit_data, depth=25)
    if fit_locals is None:
        return None
    try:
        iterator = fit_locals.get("epoch_iterator")  # Keras 3
        if iterator is not None:
            return _integer(getattr(iterator, "num_batches", None))
        return _integer(getattr(fit_locals.get("data_handler"), "inferred_steps", None))
    except Exception as error:  # a fit of another Keras version: count as before
        logger.info("could not read fit's steps per epoch (%s)", error)
        return None


def _given_in_fit() -> int | None:
    """The ``global_batch`` a StepTimer of this fit was given, if any: every callback
    of the fit then writes the same header, whichever runs first."""

    def given(frame_locals):
        members = getattr(frame_locals.get("self"), "callbacks", None)
        if not isinstance(members, list):
            return None
        values = [
            getattr(member, "global_batch", None)
            for member in members
            if isinstance(member, DataParallelCallback)
        ]
        return next((v for v in values if isinstance(v, int) and v > 0), None)

    return find_in_fit(given, depth=25)


def run_global_batch(given: int | None = None) -> tuple[int | None, str]:
    """(global batch, source) of the fit calling us: fit's own batch when it can be
    read (a ``global_batch`` that disagrees with it is ignored, with a warning), else
    ``given`` or a StepTimer's ``global_batch`` (source ``argument``).

    Args:
        given: the ``global_batch`` the user gave, if any.

    Returns:
        ``(batch, source)``; the batch is None when neither tells it.
    """
    batch, source = fit_global_batch()
    given = given or _given_in_fit()
    if batch is None:
        return (given, BATCH_FROM_ARGUMENT) if given else (None, source)
    if given and given != batch:
        _warn_mismatch(given, batch, source)
    return batch, source


_mismatches_warned: set = set()


def _warn_mismatch(given: int, batch: int, source: str) -> None:
    if (given, batch) in _mismatches_warned:
        return
    _mismatches_warned.add((given, batch))
    warn(
        f"global_batch={given} was given, but fit's data makes batches of {batch} "
        f"examples ({source}): keras_dp_tools records {batch}. If {given} is a "
        "per-replica batch, the global batch is per-replica x replicas.",
        UserWarning,
    )


def describe_run(model, global_batch: int | None) -> dict:
    """Header fields for a run training ``model`` (see docs/records.md); the recorder adds
    ``run``, ``worker`` and ``time``.

    Args:
        model: the Keras model being fit, under its strategy.
        global_batch: the ``global_batch`` the user gave, if any (``run_global_batch``).

    Returns:
        The fields, by name.
    """
    import tensorflow as tf

    import keras_dp_tools

    strategy = model.distribute_strategy
    package = keras_package(model)
    batch, batch_source = run_global_batch(global_batch)
    return {
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "strategy": type(strategy).__name__,
        "replicas": int(strategy.num_replicas_in_sync),
        "workers": worker_index(strategy)[1],
        "devices": strategy_devices(strategy),
        "global_batch": batch,
        "global_batch_source": batch_source,
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
        **_input_fields(),
    }


def _input_fields() -> dict:
    """What feeds ``fit`` (``capture.input_pipeline``); every field empty when it cannot
    be read: a header is never lost to it."""
    try:
        return describe_adapter(fit_data_adapter())
    except Exception as error:  # an adapter of another Keras version: say so, train on
        logger.info("could not read fit's input pipeline (%s)", error)
        return describe_adapter(None)


def gradient_bytes(model) -> int | None:
    """Bytes of the trainable variables: what each replica all-reduces per step.

    Args:
        model: a built Keras model.

    Returns:
        The bytes, or None where a variable cannot be sized.
    """
    try:
        total = 0
        for variable in model.trainable_variables:
            total += int(np.prod(variable.shape)) * _itemsize(variable.dtype)
        return total
    except Exception as error:  # exotic variables; bandwidths stay empty
        logger.info("could not size the trainable variables (%s)", error)
        return None


def keras3_multiworker_problem(model) -> str | None:
    """Why this fit is expected to fail, when a Keras 3 model trains under
    MultiWorkerMirroredStrategy (keras-team/keras#20585).

    Args:
        model: the Keras model being fit.

    Returns:
        The reason, with what to do instead; None for any other fit.
    """
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
