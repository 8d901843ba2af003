"""What feeds ``fit``: the kind of input and the parts of it that run Python.

Input that does not scale with replicas is one of the most common reasons a
MirroredStrategy job is slow: batches made by Python (a ``keras.utils.PyDataset`` or
``Sequence``, ``tf.data.Dataset.from_generator``, ``tf.py_function`` or
``tf.numpy_function`` in a ``map``) hold the interpreter's lock, so more replicas get
no more input. The advisor can only name such a producer if the capture says it is
there: this module reads it off ``fit``'s data adapter and the dataset's Python objects
when ``fit`` begins, without reading data or serializing the graph, and the run header
records it (``docs/records.md``, the ``input_*`` fields).
"""

from __future__ import annotations

from keras_dp_tools.records.columns import INPUT_FIELDS

# Ops that call back into Python from a tf.data function.
PYTHON_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})
GENERATOR_OP = "GeneratorDataset"  # what Dataset.from_generator builds
_MAX_DATASETS = 200  # a pipeline's datasets walked at most (zips and nests included)
_MAX_FUNCTION_DEPTH = 4  # nested functions (from_generator's live one level down)

# Keras 3 and tf_keras adapters, by class name, and what they are.
_ADAPTER_KINDS = {
    "ArrayDataAdapter": "arrays",
    "TensorLikeDataAdapter": "arrays",  # tf_keras
    "GenericArrayLikeDataAdapter": "arrays",
    "CompositeTensorDataAdapter": "arrays",
    "PyDatasetAdapter": "py_dataset",
    "KerasSequenceAdapter": "py_dataset",  # tf_keras: keras.utils.Sequence
    "GeneratorDataAdapter": "generator",
    "TFDatasetAdapter": "tf.data",
    "DatasetAdapter": "tf.data",  # tf_keras
    "DatasetCreatorAdapter": "tf.data",
}


def describe_adapter(adapter) -> dict:
    """The ``input_*`` header fields of a ``fit`` data adapter (Keras 3 or tf_keras).

    Args:
        adapter: ``fit``'s data adapter (``capture.run_info.fit_data_adapter``), or
            None when it was not found.

    Returns:
        ``input_kind`` (``arrays``, ``tf.data``, ``py_dataset``, ``generator``,
        ``distributed`` or ``unknown``), ``input_python`` (the parts that run Python,
        e.g. ``["Dataset.from_generator"]``), ``input_prefetch`` (``last``, ``not last``,
        ``missing``, ``before cache`` or None where there is no ``tf.data`` pipeline to
        read), ``input_serial_maps`` (``map`` calls without ``num_parallel_calls``),
        ``input_workers`` and ``input_multiprocessing`` (a ``PyDataset``'s).
    """
    fields = dict.fromkeys(INPUT_FIELDS)
    fields["input_kind"], fields["input_python"] = "unknown", []
    if adapter is None:
        return fields
    kind = _ADAPTER_KINDS.get(type(adapter).__name__, "unknown")
    fields["input_kind"] = kind
    if kind == "py_dataset":
        producer = getattr(adapter, "py_dataset", None) or getattr(adapter, "_keras_sequence", None)
        name = type(producer).__name__ if producer is not None else "PyDataset"
        fields["input_python"] = [f"{name}.__getitem__"]
        fields["input_workers"] = _integer(getattr(producer, "workers", None))
        multiprocessing = getattr(producer, "use_multiprocessing", None)
        fields["input_multiprocessing"] = (
            multiprocessing if isinstance(multiprocessing, bool) else None
        )
        return fields
    if kind == "generator":
        fields["input_python"] = ["a Python generator"]
        return fields
    dataset = _dataset_of(adapter)
    if dataset is not None:
        fields.update(describe_dataset(dataset))
        if kind == "unknown":
            fields["input_kind"] = "tf.data"
    return fields


def describe_dataset(dataset) -> dict:
    """``input_python``, ``input_prefetch`` and ``input_serial_maps`` of a
    ``tf.data.Dataset`` (also a distributed one), read off its Python objects: no data
    is read and no graph is serialized.

    Example:

    ```python
    import tensorflow as tf
    from keras_dp_tools.capture.input_pipeline import describe_dataset

    dataset = tf.data.Dataset.range(8).map(
        lambda x: tf.py_function(lambda y: y * 2, [x], tf.int64)
    ).batch(4)
    print(describe_dataset(dataset))
    # {'input_python': ['map(tf.py_function)'], 'input_prefetch': 'missing',
    #  'input_serial_maps': 1}
    ```
    """
    chain = list(_datasets(_undistributed(dataset)))
    python, serial_maps = [], 0
    for node in chain:
        kind = type(node).__name__
        ops = _function_ops(node)
        if GENERATOR_OP in ops:
            python.append("Dataset.from_generator")
        elif ops & PYTHON_OPS:
            name = "tf.numpy_function" if "PyFunc" in ops else "tf.py_function"
            python.append(f"{_stage_name(kind)}({name})")
        if kind == "_MapDataset":
            serial_maps += 1
    return {
        "input_python": list(dict.fromkeys(reversed(python))),  # source first, once each
        "input_prefetch": _prefetch_placement([type(node).__name__ for node in chain]),
        "input_serial_maps": serial_maps,
    }


def _dataset_of(adapter):
    import tensorflow as tf

    data = getattr(adapter, "_dataset", None)
    if isinstance(data, (tf.data.Dataset, tf.distribute.DistributedDataset)):
        return data
    return None


def _undistributed(dataset):
    """The ``tf.data.Dataset`` a distributed dataset was made of (itself otherwise)."""
    original = getattr(dataset, "_original_dataset", None)
    return original if original is not None else dataset


def _datasets(dataset):
    """The pipeline's datasets, from the output towards the sources (all inputs of a
    zip or concatenate), each once."""
    stack, seen = [dataset], set()
    while stack and len(seen) < _MAX_DATASETS:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        stack.extend(reversed(_inputs(node)))


def _inputs(dataset) -> list:
    """A dataset's input datasets (tf.data's own ``_inputs``; a source has none)."""
    try:
        return list(dataset._inputs())
    except Exception:  # another TF version, or not a dataset
        found = getattr(dataset, "_input_dataset", None)
        return [found] if found is not None else []


def _function_ops(dataset) -> set[str]:
    """Op types of the dataset's own function (a map's, a flat_map's, a filter's) and
    of the functions it calls, a few levels down."""
    function = getattr(dataset, "_map_func", None) or getattr(dataset, "_predicate", None)
    graph = getattr(getattr(function, "function", None), "graph", None)
    return _graph_ops(graph, _MAX_FUNCTION_DEPTH) if graph is not None else set()


def _graph_ops(graph, depth: int) -> set[str]:
    ops = {op.type for op in graph.get_operations()}
    if depth > 0:
        for function in getattr(graph, "_functions", {}).values():
            inner = getattr(function, "graph", None)
            if inner is not None:
                ops |= _graph_ops(inner, depth - 1)
    return ops


def _stage_name(kind: str) -> str:
    return {
        "_MapDataset": "map",
        "_ParallelMapDataset": "map",
        "_FlatMapDataset": "flat_map",
        "_InterleaveDataset": "interleave",
        "_ParallelInterleaveDataset": "interleave",
        "_FilterDataset": "filter",
    }.get(kind, kind.strip("_"))


# Datasets that only pass their input on: a prefetch behind them is still the last step.
_PASS_THROUGH = frozenset({"_OptionsDataset", "_AssertCardinalityDataset", "_RepeatDataset"})


def _prefetch_placement(kinds: list[str]) -> str | None:
    """Where the pipeline prefetches: ``last`` (what the tf.data guide advises),
    ``not last``, ``before cache`` (the cache then stores what prefetch made: no overlap
    once cached), ``missing``; None when the walk found no pipeline."""
    if not kinds:
        return None
    prefetches = [index for index, kind in enumerate(kinds) if kind == "_PrefetchDataset"]
    if not prefetches:
        return "missing"
    caches = [i for i, kind in enumerate(kinds) if kind in ("CacheDataset", "_CacheDataset")]
    # Every prefetch deeper than the outermost cache: the cache stores prefetched batches.
    if caches and all(index > min(caches) for index in prefetches):
        return "before cache"
    outermost = next(kind for kind in kinds if kind not in _PASS_THROUGH)
    return "last" if outermost == "_PrefetchDataset" else "not last"


def _integer(value) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None
