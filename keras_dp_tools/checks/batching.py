"""The run-time batching check: is the dataset batched for the replica count?

The classic bug: ``dataset.batch(64)`` under a 4-replica strategy trains with 16
examples per replica, because a batch given to a strategy is the *global* batch. The
check reads the batch size from the dataset itself and never consumes data: from the
batch op's Python object (``walk_batch``), else from the batch node of the dataset's
serialized graph, which copies every in-memory array the dataset holds (seconds for a
``from_tensor_slices`` over a few hundred MB). For arrays given to ``fit(x, y,
batch_size=...)``, the batch is the one ``fit``'s data adapter makes
(``adapter_batch``).
"""

from __future__ import annotations

from dataclasses import dataclass

from keras_dp_tools.checks.literal_batch import LiteralProduct
from keras_dp_tools.common.findings import Finding  # the check returns Findings
from keras_dp_tools.common.validation import require_positive_int
from keras_dp_tools.common.warn import warn as warn_at_user
from keras_dp_tools.setup.scaling import replica_count

# Dataset ops that batch (the first input is the dataset, the second the batch size).
_BATCH_OPS = {
    "BatchDataset": None,
    "BatchDatasetV2": 2,  # index of drop_remainder among the inputs
    "PaddedBatchDataset": None,
    "PaddedBatchDatasetV2": -1,
    "ParallelBatchDataset": -1,
    "MapAndBatchDataset": -1,
}
_UNBATCH_OPS = {"UnbatchDataset", "ExperimentalUnbatchDataset"}


class BatchScalingWarning(UserWarning):
    """The dataset's batch does not fit the strategy's replica count."""


@dataclass(frozen=True)
class DatasetBatch:
    """What a dataset says about its batch: ``size`` (None if unknown or unbatched),
    ``drop_remainder`` (None if unknown), ``batched`` (False: no batch op found, None:
    cannot tell), ``remainder`` (examples in the smaller last batch of a pass: 0 when
    every batch is full, None when the number of examples is unknown), ``source``
    (``"dataset"``, or ``"fit"`` for arrays that ``fit(batch_size=...)`` batches), and
    ``pass_batches``: the batches of one pass over the data when the smaller last batch
    is known to be the pass's last one in the stream ``fit`` reads (nothing after the
    batch op reorders, drops or adds batches), else None. ``source`` is
    ``"generator"`` for batches made by the data's source (a generator, ``Sequence`` or
    ``PyDataset`` whose elements have the model's input rank). ``written``: the batch
    size as the user's code writes it, when that is a product of numbers
    (``batch(32 * 4)``), else None."""

    size: int | None
    drop_remainder: bool | None
    batched: bool | None
    remainder: int | None = None
    source: str = "dataset"
    pass_batches: int | None = None
    written: LiteralProduct | None = None


# Datasets that pass their input's batches on whole (a map is taken not to cut batches);
# of them, those that also keep the batches' order and number, so that a pass's smaller
# last batch stays its last; and the batch ops, with the attributes of their batch size
# and drop_remainder. Any other dataset between the output and the batch op sends the
# reading to the graph.
_KEEP_ORDER = frozenset(
    {
        "_PrefetchDataset",
        "_MapDataset",
        "_ParallelMapDataset",
        "CacheDataset",
        "_CacheDataset",
        "_RepeatDataset",
        "_OptionsDataset",
        "_AssertCardinalityDataset",
    }
)
_KEEP_BATCH = _KEEP_ORDER | {
    "_ShuffleDataset",
    "_TakeDataset",
    "_SkipDataset",
    "_FilterDataset",
    "_IgnoreErrorsDataset",
    "_ShardDataset",
}
_BATCH_ATTRIBUTES = {
    "_BatchDataset": ("_batch_size", "_drop_remainder"),
    "_ParallelBatchDataset": ("_batch_size", "_drop_remainder"),
    "_PaddedBatchDataset": ("_batch_size", "_drop_remainder"),
    "_MapAndBatchDataset": ("_batch_size_t", "_drop_remainder_t"),
}
# Parallel datasets that keep their input's order only when deterministic: their own
# ``deterministic=`` argument ("true", "false"), else ("default") the pipeline's
# ``tf.data.Options().deterministic`` (True unless set).
_PARALLEL = frozenset({"_ParallelMapDataset", "_ParallelBatchDataset"})
_UNBATCH_DATASETS = frozenset({"_UnbatchDataset"})
# Sources that never batch: reaching one first means there is no batch op.
_PLAIN_SOURCES = frozenset({"_TensorSliceDataset", "_RangeDataset"})
# Sources whose elements may be whole batches: from_generator is a flat map over a
# generator; an interleave reads files or datasets that may hold batches.
_SOURCES_THAT_MAY_BATCH = frozenset(
    {"_FlatMapDataset", "_GeneratorDataset", "_InterleaveDataset", "_ParallelInterleaveDataset"}
)
_MAX_WALK = 100


def _eager_value(value):
    """A Python value of an eager tensor or number; None for a symbolic tensor (a
    dataset built inside a ``tf.function``) or anything else."""
    read = getattr(value, "numpy", None)
    try:
        return (read() if callable(read) else value).item()
    except (AttributeError, NotImplementedError, TypeError, ValueError):
        return value if isinstance(value, (bool, int)) else None


def walk_batch(dataset) -> tuple[DatasetBatch | None, str]:
    """What the batch op nearest to the dataset's output says, read off the dataset's
    Python objects (``_input_dataset`` links): no data is read and no graph is
    serialized. Returns (the ``DatasetBatch``, the kind of dataset that decided), or
    (None, why not) when the walk meets a dataset it does not know; an unbatch, or a
    plain source reached first, reads as not batched.

    The remainder is the cardinality of the batch op's input (a cheap op) modulo the
    batch size: 0 for an endless input, None when its cardinality is unknown.
    """
    in_order = True
    ordered_default = _options_deterministic(dataset)
    for _ in range(_MAX_WALK):
        kind = type(dataset).__name__
        if kind in _PARALLEL:
            flag = getattr(dataset, "_deterministic", "default")
            in_order = in_order and (flag == "true" or (flag == "default" and ordered_default))
        if kind in _BATCH_ATTRIBUTES:
            batch = _batch_op(dataset, kind, in_order)
            if batch is None:
                return None, (
                    f"its {kind}'s batch size or drop_remainder is not a constant (a "
                    "dataset built inside a tf.function?)"
                )
            return batch, kind
        if kind in _UNBATCH_DATASETS or kind in _PLAIN_SOURCES:
            return DatasetBatch(None, None, batched=False), kind
        if kind not in _KEEP_BATCH:
            return None, f"its pipeline reaches a {kind} before any batch op"
        in_order = in_order and kind in _KEEP_ORDER
        dataset = getattr(dataset, "_input_dataset", None)
    return None, f"its pipeline has no batch op within {_MAX_WALK} steps"


def _options_deterministic(dataset) -> bool:
    """Whether the pipeline's options leave its parallel ops deterministic (the default);
    False when ``tf.data.Options().deterministic = False`` or they cannot be read."""
    try:
        return dataset.options().deterministic is not False
    except Exception:  # options of another TF version, or none: take no order on trust
        return False


def _batch_op(dataset, kind: str, in_order: bool) -> DatasetBatch | None:
    import tensorflow as tf

    size_name, drop_name = _BATCH_ATTRIBUTES[kind]
    size = _eager_value(getattr(dataset, size_name, None))
    drop = _eager_value(getattr(dataset, drop_name, None))
    if not isinstance(size, int) or not isinstance(drop, bool) or size <= 0:
        return None
    if drop:
        return DatasetBatch(size, True, batched=True, remainder=0)
    try:
        examples = int(dataset._input_dataset.cardinality())
    except (AttributeError, tf.errors.OpError, TypeError, ValueError):
        return DatasetBatch(size, False, batched=True)
    if examples == tf.data.INFINITE_CARDINALITY:
        return DatasetBatch(size, False, batched=True, remainder=0)
    if examples < 0:
        return DatasetBatch(size, False, batched=True)
    pass_batches = -(-examples // size) if in_order else None
    return DatasetBatch(
        size, False, batched=True, remainder=examples % size, pass_batches=pass_batches
    )


def _graph_batch(dataset) -> DatasetBatch | None:
    """The outermost batch op of the dataset's graph, walking from the output."""
    import tensorflow as tf
    from tensorflow.core.framework import graph_pb2

    try:
        serialized = tf.raw_ops.DatasetToGraphV2(input_dataset=dataset._variant_tensor)
    except (AttributeError, tf.errors.OpError, TypeError):
        return None
    graph = graph_pb2.GraphDef()
    graph.ParseFromString(serialized.numpy())
    nodes = {node.name: node for node in graph.node}

    def constant(name):
        node = nodes.get(name.split(":")[0].lstrip("^"))
        if node is None or node.op != "Const":
            return None
        return tf.make_ndarray(node.attr["value"].tensor).item()

    output = next((node for node in graph.node if node.op == "_Retval"), None)
    node = nodes.get(output.input[0].split(":")[0]) if output is not None and output.input else None
    seen = set()
    while node is not None and node.name not in seen:
        seen.add(node.name)
        if node.op in _UNBATCH_OPS:
            return DatasetBatch(None, None, batched=False)
        if node.op in _BATCH_OPS:
            size = constant(node.input[1]) if len(node.input) > 1 else None
            drop_index = _BATCH_OPS[node.op]
            drop = constant(node.input[drop_index]) if drop_index is not None else False
            size = None if size is None else int(size)
            remainder = 0 if drop else _remainder(graph, output, node.input[0], size)
            return DatasetBatch(size, drop, batched=True, remainder=remainder)
        node = nodes.get(node.input[0].split(":")[0]) if node.input else None
    return DatasetBatch(None, None, batched=False)


def _remainder(graph, output, batch_input: str, size: int | None) -> int | None:
    """Examples left for a smaller last batch: the cardinality of what the batch op
    reads (rebuilt from the graph with the batch's input as output), modulo the batch
    size. An endless input (``repeat()``) has no last batch; None when unknown (e.g. a
    generator)."""
    import tensorflow as tf

    if not size:
        return None
    original = output.input[0]
    output.input[0] = batch_input
    try:
        variant = tf.raw_ops.DatasetFromGraph(graph_def=graph.SerializeToString())
        examples = int(tf.raw_ops.DatasetCardinality(input_dataset=variant))
    except (tf.errors.OpError, TypeError, ValueError):
        return None
    finally:
        output.input[0] = original
    if examples == tf.data.INFINITE_CARDINALITY:
        return 0
    return None if examples < 0 else examples % size


def dataset_batch(
    dataset, input_ranks: tuple[int, ...] | None = None, first_batch_size: int | None = None
) -> DatasetBatch:
    """The batch size and remainder policy a ``tf.data.Dataset`` was batched with.

    Read from the batch op nearest to the output: its Python object (``walk_batch``),
    else the dataset's graph. Without one, the elements may still be batches made by
    the source (a generator): with the model's ``input_ranks`` (``model_input_ranks``),
    elements of that rank are batches of their leading size (``first_batch_size``, or
    None: unknown), elements of one rank less are single examples. Without the ranks,
    a source that may batch reads as ``batched=None`` (unknown). If the graph cannot be
    read, a known leading dimension of the static shape is taken as the batch.
    """
    import tensorflow as tf

    first = tf.nest.flatten(dataset.element_spec)[0]
    shape = getattr(first, "shape", None)
    leading = shape[0] if shape is not None and shape.rank else None
    walked = walk_batch(dataset)[0]
    read = walked or _graph_batch(dataset)
    if read is None:  # no graph: trust the static shape
        if leading is not None:
            return DatasetBatch(int(leading), True, batched=True, remainder=0)
        return DatasetBatch(None, None, batched=None)
    if read.batched is False and shape is not None and shape.rank:
        by_rank = source_batch(dataset.element_spec, input_ranks, first_batch_size)
        if by_rank is not None:
            return by_rank
        if leading is None or (walked is None and _may_batch_itself(dataset)):
            return DatasetBatch(None, None, batched=None)
    return read


def _may_batch_itself(dataset) -> bool:
    """Whether the pipeline's source, past datasets that keep batches whole, is one
    that can yield whole batches: ``from_generator`` (a flat map) or an interleave."""
    for _ in range(_MAX_WALK):
        kind = type(dataset).__name__
        if kind in _SOURCES_THAT_MAY_BATCH:
            return True
        if kind not in _KEEP_BATCH:
            return False
        dataset = getattr(dataset, "_input_dataset", None)
    return False


def model_input_ranks(model) -> tuple[int, ...] | None:
    """The ranks of a Keras 3 or tf_keras model's inputs, batch dimension included
    (``(2,)`` for ``keras.Input((8,))``); None when the model has no known inputs yet (a
    subclassed model built by its first step)."""
    import tensorflow as tf

    try:
        inputs = model.inputs
    except (AttributeError, ValueError):  # tf_keras/Keras 3 on a model not built yet
        return None
    ranks = []
    for tensor in tf.nest.flatten(inputs or []):
        shape = getattr(tensor, "shape", None)
        try:
            ranks.append(len(shape))
        except (TypeError, ValueError):  # unknown rank
            return None
    return tuple(ranks) or None


def source_batch(
    element_spec, input_ranks: tuple[int, ...] | None, first_batch_size: int | None = None
) -> DatasetBatch | None:
    """What the rank of a source's elements says (a source with no batch op: a
    generator, ``Sequence``, ``PyDataset``): elements with the model's input ranks are
    batches (``source="generator"``) of their static leading size, else of
    ``first_batch_size`` (the first batch's, when the data adapter kept it), else of
    unknown size; elements one rank lower are single examples (not batched). None when
    the ranks say neither (or are unknown).
    """
    import tensorflow as tf

    features = element_spec
    if isinstance(element_spec, tuple) and 1 < len(element_spec) <= 3:  # (x, y[, weights])
        features = element_spec[0]
    leaves = tf.nest.flatten(features)
    ranks = [getattr(getattr(leaf, "shape", None), "rank", None) for leaf in leaves]
    if not input_ranks or not leaves or None in ranks or len(ranks) != len(input_ranks):
        return None
    if sorted(ranks) == sorted(input_ranks):
        leading = leaves[0].shape[0]
        size = int(leading) if leading is not None else first_batch_size
        return DatasetBatch(size, None, batched=True, source="generator")
    if sorted(rank + 1 for rank in ranks) == sorted(input_ranks):
        return DatasetBatch(None, None, batched=False)
    return None


def _adapter_value(adapter, name: str):
    try:  # Keras 3's generator and PyDataset adapters raise for what they do not know
        value = getattr(adapter, name, None)  # Keras 3: properties; tf_keras: methods
        return value() if callable(value) else value
    except NotImplementedError:
        return None


def _first_batch_size(adapter) -> int | None:
    """The size of the first batch a generator, ``Sequence`` or ``PyDataset`` gives
    ``fit``: as its data adapter kept it (tf_keras: ``_first_batch_size``; Keras 3:
    ``_first_batches`` of a generator), or, for a Keras 3 ``PyDataset`` (whose spec
    leaves the batch size out), its item 0, read again as Keras read it for the spec:
    a ``PyDataset`` is indexed, so nothing is consumed."""
    import tensorflow as tf

    size = getattr(adapter, "_first_batch_size", None)
    if isinstance(size, int):
        return size
    batches = getattr(adapter, "_first_batches", None)
    if batches is None and getattr(adapter, "py_dataset", None) is not None:
        try:
            batches = [adapter.py_dataset[0]]
        except Exception:  # the user's __getitem__: what it raises is not ours to judge
            return None
    try:
        size = tf.nest.flatten(batches[0])[0].shape[0]
    except (IndexError, TypeError, ValueError, AttributeError):
        return None
    return int(size) if size is not None else None


def adapter_batch(adapter, input_ranks: tuple[int, ...] | None = None) -> DatasetBatch | None:
    """What ``fit``'s data adapter (Keras 3 or tf_keras) says about its batch; None if
    it says nothing.

    For arrays, ``fit(x, y, batch_size=...)`` batches by ``batch_size`` and keeps a
    smaller last batch (the adapter knows its size). For a ``tf.data.Dataset``, the
    dataset the adapter wraps is read with ``dataset_batch``; for a generator,
    ``Sequence`` or ``PyDataset``, the rank of its elements against the model's
    ``input_ranks`` says whether they are batches (``source_batch``).
    """
    import tensorflow as tf

    size = _adapter_value(adapter, "batch_size")
    partial = _adapter_value(adapter, "has_partial_batch")
    if size is not None and isinstance(partial, bool):  # arrays: fit batches them
        remainder = int(_adapter_value(adapter, "partial_batch_size") or 0) if partial else 0
        return DatasetBatch(int(size), False, batched=True, remainder=remainder, source="fit")
    first = _first_batch_size(adapter)
    dataset = getattr(adapter, "_dataset", None)
    if isinstance(dataset, tf.data.Dataset):
        return dataset_batch(dataset, input_ranks, first)
    signature = getattr(adapter, "_output_signature", None)  # Keras 3's generators
    if signature is not None:
        read = source_batch(signature, input_ranks, first)
        return read if read is not None else DatasetBatch(None, None, batched=None)
    if size is not None:
        return DatasetBatch(int(size), None, batched=True, source="fit")
    return None


def adapter_distributed_input(adapter):
    """The dataset of ``distribute_datasets_from_function`` that ``fit``'s data adapter
    wraps, else None: its ``dataset_fn`` batches per replica by contract, so its batch is
    not a global batch to check against the replica count."""
    for name in ("_dataset", "dataset", "_iterator"):
        value = getattr(adapter, name, None)
        if is_distributed(value) and "FromFunction" in type(value).__name__:
            return value
    return None


def is_distributed(dataset) -> bool:
    import tensorflow as tf

    return isinstance(
        dataset, (tf.distribute.DistributedDataset, tf.distribute.DistributedIterator)
    )


def check_batching(
    dataset, strategy, per_replica_batch: int | None = None, warn: bool = True, model=None
):
    """Checks that ``dataset`` is batched right for ``strategy``; returns the findings.

    Each problem is also reported with ``warnings.warn(..., kdt.BatchScalingWarning)``
    (unless ``warn=False``). Findings (``Finding.code``):

    * ``missing-multiply`` (error): the dataset's batch equals the intended
      ``per_replica_batch``, so each replica gets a fraction of it;
    * ``batch-mismatch`` (warning): the batch is neither the per-replica nor the
      global batch you intended;
    * ``uneven-split`` (warning): the global batch does not divide by the replicas;
    * ``empty-replicas`` (error): fewer examples per step than replicas;
    * ``partial-last-batch`` (info): ``drop_remainder=False`` and the examples do not
      divide by the batch (or their number is unknown): the last step's batch is
      smaller and split unevenly, with a shape of its own;
    * ``unbatched`` / ``unknown-batch`` (warning): no batch to check; said, not guessed;
    * ``already-distributed`` (info): a distributed dataset batches per replica itself;
    * ``hard-coded-replica-count`` (info when the product equals this run's replicas,
      else warning): the batch is written as a product of numbers (``batch(32 * 4)``),
      one of them most likely a device count; the fix replaces that factor by
      ``strategy.num_replicas_in_sync`` rather than multiplying twice. Only a
      ``DatasetBatch`` whose ``written`` is set (``kdt.BatchScalingCheck`` reads it from
      your source) has one.

    Example:

    ```python
    import tensorflow as tf
    import keras_dp_tools as kdt

    strategy = kdt.mirrored_strategy(4)
    dataset = tf.data.Dataset.range(1024).batch(64)  # meant 64 per replica
    for finding in kdt.check_batching(dataset, strategy, per_replica_batch=64):
        print(finding.severity, finding)  # error: ... batch(64 * 4) ...
    ```

    Args:
        dataset: a ``tf.data.Dataset`` (or a distributed dataset), or a
            ``DatasetBatch`` already read (``adapter_batch`` for arrays given to
            ``fit``; ``kdt.BatchScalingCheck`` reads it for you).
        strategy: the ``tf.distribute`` strategy, or the replica count.
        per_replica_batch: the examples per replica you intend; without it the check
            cannot tell a missing multiply from a deliberate small global batch.
        warn: also issue a ``BatchScalingWarning`` per problem.
        model: the model the dataset feeds: a dataset with no batch op (a generator)
            whose elements have the rank of the model's inputs yields batches itself,
            and is checked by their leading size, not called unbatched.

    Returns:
        A list of ``kdt.Finding``, empty when the batch fits.
    """
    replicas = replica_count(strategy)
    if per_replica_batch is not None:
        per_replica_batch = require_positive_int("per_replica_batch", per_replica_batch)
    ranks = model_input_ranks(model) if model is not None else None
    findings = _findings(dataset, replicas, per_replica_batch, ranks)
    if warn:
        warn_findings(findings)
    return findings


def warn_findings(findings: list[Finding]) -> None:
    """A ``BatchScalingWarning`` per problem (info findings stay quiet)."""
    for finding in findings:
        if finding.severity != "info":
            warn_at_user(str(finding), BatchScalingWarning)


def _findings(dataset, replicas: int, per_replica: int | None, ranks=None) -> list[Finding]:
    import tensorflow as tf

    if isinstance(dataset, DatasetBatch):
        return _batch_findings(dataset, replicas, per_replica)
    if is_distributed(dataset):
        return [
            Finding(
                "info",
                "already-distributed",
                "The dataset is already distributed: its batches are per replica, so the "
                "global batch cannot be read from it.",
                "Check the batch of the dataset you distribute (before "
                "strategy.experimental_distribute_dataset), or use "
                "input_context.get_per_replica_batch_size in distribute_datasets_from_function.",
            )
        ]
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(
            f"check_batching reads the batch of a tf.data.Dataset; received a "
            f"{type(dataset).__module__}.{type(dataset).__qualname__}. For arrays given to "
            "fit(x, y, batch_size=...), add kdt.BatchScalingCheck(per_replica_batch=...) "
            "to fit's callbacks: it reads the batch fit makes."
        )
    return _batch_findings(dataset_batch(dataset, ranks), replicas, per_replica)


def unknown_batch(reason: str) -> Finding:
    """The finding for a batch that cannot be read: said, not guessed."""
    return Finding(
        "warning",
        "unknown-batch",
        f"The batch size cannot be read ({reason}), so it cannot be checked.",
        "Batch with dataset.batch(global_batch) or fit(batch_size=global_batch), where "
        "global_batch = per-replica batch * strategy.num_replicas_in_sync.",
    )


# Findings that propose a batch for the replica count: none of them is right when the
# model trains one replica by mistake (checks.data_parallelism), so they are left out then.
REPLICA_SPLIT_CODES = frozenset(
    {"missing-multiply", "batch-mismatch", "uneven-split", "empty-replicas", "plan-mismatch"}
    | {"hard-coded-replica-count"}
)


def _batch_call(source: str, size) -> str:
    """How the batch is set, for a message or a fix: ``dataset.batch(256)``,
    ``fit(batch_size=256)``, or the batches a generator yields."""
    if source == "fit":
        return f"fit(batch_size={size})"
    if source == "generator":
        return f"yield batches of {size}"
    return f"dataset.batch({size})"


def _batch_findings(batch: DatasetBatch, replicas: int, per_replica: int | None) -> list[Finding]:
    wanted = _batch_call(batch.source, f"{per_replica} * strategy.num_replicas_in_sync")
    if batch.batched is False:
        return [
            Finding(
                "warning",
                "unbatched",
                "The dataset is not batched (no batch op in its graph, and its elements "
                "are single examples): fit would feed single examples as batches.",
                f"Batch it with the global batch: {wanted}."
                if per_replica
                else "Batch it with per-replica batch * strategy.num_replicas_in_sync.",
            )
        ]
    if batch.size is None:
        if batch.source == "generator":
            return [
                unknown_batch(
                    "the source yields whole batches (its elements have the model's input "
                    "rank), but their size is in neither its spec nor a first batch"
                )
            ]
        return [
            unknown_batch("no batch op in the dataset; its source, e.g. a generator, may batch")
        ]
    size, findings = batch.size, []
    batched_by = {
        "fit": f"fit's batch_size is {size}",
        "generator": "The data's source (a generator, Sequence or PyDataset) yields "
        f"batches of {size}",
    }.get(batch.source, f"The dataset is batched by {size}")
    if per_replica is not None and replicas > 1 and size == per_replica:
        findings.append(
            Finding(
                "error",
                "missing-multiply",
                f"{batched_by}, your per-replica batch: under "
                f"{replicas} replicas each replica trains on {size // replicas} examples "
                f"per step, not {size}.",
                f"{wanted} = {_batch_call(batch.source, per_replica * replicas)} "
                "(kdt.scale_batch_size)." + _already_global_note(batch, replicas),
            )
        )
    elif per_replica is not None and size != per_replica * replicas:
        findings.append(
            Finding(
                "warning",
                "batch-mismatch",
                f"{batched_by}; {per_replica} per replica on {replicas} "
                f"replicas makes {per_replica * replicas}.",
                f"{wanted} = {_batch_call(batch.source, per_replica * replicas)}."
                + _already_global_note(batch, replicas),
            )
        )
    elif per_replica is None and batch.written is not None:
        findings.append(_hard_coded_count(batch, replicas))
    if size < replicas:
        findings.append(
            Finding(
                "error",
                "empty-replicas",
                f"A batch of {size} over {replicas} replicas leaves "
                f"{replicas - size} replica(s) with 0 examples per step.",
                f"Use a global batch of at least {replicas}, ideally a multiple of it.",
            )
        )
    elif size % replicas:
        findings.append(
            Finding(
                "warning",
                "uneven-split",
                f"A batch of {size} does not divide by {replicas} replicas: replicas get "
                f"{size // replicas} or {size // replicas + 1} examples, and the fuller ones "
                "set the pace.",
                f"Use a multiple of {replicas}, e.g. {(size // replicas + 1) * replicas}.",
            )
        )
    if batch.drop_remainder is False and batch.remainder != 0:
        findings.append(_partial_last_batch(batch))
    return findings


def _written_at(written: LiteralProduct) -> str:
    return f" (line {written.line} of {written.path})" if written.path else ""


def _hard_coded_count(batch: DatasetBatch, replicas: int) -> Finding:
    """A batch written as ``per * count``: the count by hand, where the strategy knows it.

    The run decides the severity: if the count is this run's replica count, the product
    is already the global batch (info: it will not follow another device count); if not,
    each replica trains on ``size / replicas``, not the ``per`` the code reads as."""
    written = batch.written
    count = written.count_factor(replicas)
    call = _batch_call(batch.source, written.text)
    fix = (
        f"If {count} is your replica count, write "
        f"{_batch_call(batch.source, written.scaled_text(replicas))}."
    )
    per_replica = batch.size // count
    if count == replicas:
        return Finding(
            "info",
            "hard-coded-replica-count",
            f"{call}{_written_at(written)} writes this run's {replicas} replicas as a number: "
            f"{batch.size} is a global batch of {per_replica} per replica here, but stays "
            f"{batch.size} on another number of devices.",
            fix,
        )
    return Finding(
        "warning",
        "hard-coded-replica-count",
        f"{call}{_written_at(written)} reads as {per_replica} per replica on {count} "
        f"replicas, but this run has {replicas}: each replica trains on "
        f"{batch.size / replicas:g} examples per step.",
        fix,
    )


def _already_global_note(batch: DatasetBatch, replicas: int) -> str:
    """For a batch written ``32 * 4`` with 4 = this run's replicas: the product may
    already be the global batch, and scaling it again would multiply twice."""
    written = batch.written
    if written is None or written.count_factor(replicas) != replicas:
        return ""
    rest = batch.size // replicas
    return (
        f" But it is written {written.text}: if {replicas} is your replica count, it is "
        f"already a global batch of {rest} per replica; then write "
        f"{_batch_call(batch.source, written.scaled_text(replicas))} and say "
        f"per_replica_batch={rest}."
    )


def _partial_last_batch(batch: DatasetBatch) -> Finding:
    consequence = (
        "split unevenly over replicas, with a shape of its own (one more trace of the "
        "train function)."
    )
    if batch.source == "fit":
        return Finding(
            "info",
            "partial-last-batch",
            f"The examples do not divide by batch_size={batch.size}: the last step of each "
            f"epoch has {batch.remainder} examples, " + consequence,
            "Use a batch size that divides the number of examples, or leave the "
            f"{batch.remainder} extra examples out.",
        )
    known = batch.remainder is not None
    return Finding(
        "info",
        "partial-last-batch",
        "The dataset keeps a partial last batch (drop_remainder=False): the last step of "
        + (f"each pass has {batch.remainder} examples, " if known else "each pass can be smaller, ")
        + consequence,
        "dataset.batch(global_batch, drop_remainder=True), if losing the remainder is fine.",
    )
