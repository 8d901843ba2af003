"""The run-time batching check: is the dataset batched for the replica count?

The classic bug: ``dataset.batch(64)`` under a 4-replica strategy trains with 16
examples per replica, because a batch given to a strategy is the *global* batch. The
check reads the batch size from the dataset itself (its static shapes, or the batch
node of its graph) and never consumes data.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from keras_dp_tools.scaling import replica_count, require_positive_int
from keras_dp_tools.severity import Severity

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
class Finding:
    """One problem (or remark) about batching: ``severity`` is a ``Severity``
    (``error``, ``warning`` or ``info``); ``code`` a stable identifier; ``fix`` what to
    change."""

    severity: Severity
    code: str
    message: str
    fix: str

    def __post_init__(self):
        object.__setattr__(self, "severity", Severity(self.severity))

    def __str__(self) -> str:
        return f"{self.message} Fix: {self.fix}"


@dataclass(frozen=True)
class DatasetBatch:
    """What a dataset says about its batch: ``size`` (None if unknown or unbatched),
    ``drop_remainder`` (None if unknown), ``batched`` (False: no batch op found, None:
    cannot tell)."""

    size: int | None
    drop_remainder: bool | None
    batched: bool | None


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
            return DatasetBatch(None if size is None else int(size), drop, batched=True)
        node = nodes.get(node.input[0].split(":")[0]) if node.input else None
    return DatasetBatch(None, None, batched=False)


def dataset_batch(dataset) -> DatasetBatch:
    """The batch size and remainder policy a ``tf.data.Dataset`` was batched with.

    Read from the batch op of the dataset's graph. Without one, a leading dimension of
    unknown size may still be a batch made by the source (a generator): ``batched`` is
    then None (unknown). If the graph cannot be read, a known leading dimension of the
    static shape is taken as the batch.
    """
    import tensorflow as tf

    first = tf.nest.flatten(dataset.element_spec)[0]
    shape = getattr(first, "shape", None)
    leading = shape[0] if shape is not None and shape.rank else None
    from_graph = _graph_batch(dataset)
    if from_graph is None:  # no graph: trust the static shape
        if leading is not None:
            return DatasetBatch(int(leading), True, batched=True)
        return DatasetBatch(None, None, batched=None)
    if not from_graph.batched and shape is not None and shape.rank and leading is None:
        return DatasetBatch(None, None, batched=None)
    return from_graph


def _is_distributed(dataset) -> bool:
    import tensorflow as tf

    return isinstance(
        dataset, (tf.distribute.DistributedDataset, tf.distribute.DistributedIterator)
    )


def check_batching(dataset, strategy, per_replica_batch: int | None = None, warn: bool = True):
    """Checks that ``dataset`` is batched right for ``strategy``; returns the findings.

    Each problem is also reported with ``warnings.warn(..., kdt.BatchScalingWarning)``
    (unless ``warn=False``). Findings (``Finding.code``):

    * ``missing-multiply`` (error): the dataset's batch equals the intended
      ``per_replica_batch``, so each replica gets a fraction of it;
    * ``batch-mismatch`` (warning): the batch is neither the per-replica nor the
      global batch you intended;
    * ``uneven-split`` (warning): the global batch does not divide by the replicas;
    * ``empty-replicas`` (error): fewer examples per step than replicas;
    * ``partial-last-batch`` (info): ``drop_remainder=False``: the last step's batch
      can be smaller and split unevenly, with a shape of its own;
    * ``unbatched`` / ``unknown-batch`` (warning): no batch to check; said, not guessed;
    * ``already-distributed`` (info): a distributed dataset batches per replica itself.

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
        dataset: a ``tf.data.Dataset`` (or a distributed dataset).
        strategy: the ``tf.distribute`` strategy, or the replica count.
        per_replica_batch: the examples per replica you intend; without it the check
            cannot tell a missing multiply from a deliberate small global batch.
        warn: also issue a ``BatchScalingWarning`` per problem.
    """
    replicas = replica_count(strategy)
    if per_replica_batch is not None:
        per_replica_batch = require_positive_int("per_replica_batch", per_replica_batch)
    findings = _findings(dataset, replicas, per_replica_batch)
    if warn:
        for finding in findings:
            if finding.severity != "info":
                warnings.warn(str(finding), BatchScalingWarning, stacklevel=2)
    return findings


def _findings(dataset, replicas: int, per_replica: int | None) -> list[Finding]:
    if _is_distributed(dataset):
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
    batch = dataset_batch(dataset)
    wanted = f"dataset.batch({per_replica} * strategy.num_replicas_in_sync)"
    if batch.batched is False:
        return [
            Finding(
                "warning",
                "unbatched",
                "The dataset is not batched (no batch op in its graph): fit would feed "
                "single examples as batches.",
                f"Batch it with the global batch: {wanted}."
                if per_replica
                else "Batch it with per-replica batch * strategy.num_replicas_in_sync.",
            )
        ]
    if batch.size is None:
        return [
            Finding(
                "warning",
                "unknown-batch",
                "The dataset's batch size cannot be read from it (no batch op; the source, "
                "e.g. a generator, may batch itself), so it cannot be checked.",
                "Batch with dataset.batch(global_batch) where global_batch = per-replica "
                "batch * strategy.num_replicas_in_sync.",
            )
        ]
    size, findings = batch.size, []
    if per_replica is not None and replicas > 1 and size == per_replica:
        findings.append(
            Finding(
                "error",
                "missing-multiply",
                f"The dataset is batched by {size}, your per-replica batch: under "
                f"{replicas} replicas each replica trains on {size // replicas} examples "
                f"per step, not {size}.",
                f"{wanted} = dataset.batch({per_replica * replicas}) (kdt.scale_batch_size).",
            )
        )
    elif per_replica is not None and size != per_replica * replicas:
        findings.append(
            Finding(
                "warning",
                "batch-mismatch",
                f"The dataset is batched by {size}; {per_replica} per replica on {replicas} "
                f"replicas makes {per_replica * replicas}.",
                f"{wanted} = dataset.batch({per_replica * replicas}).",
            )
        )
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
    if batch.drop_remainder is False:
        findings.append(
            Finding(
                "info",
                "partial-last-batch",
                "The dataset keeps a partial last batch (drop_remainder=False): the last "
                "step of each pass has fewer examples, split unevenly over replicas, with "
                "a shape of its own (one more trace of the train function).",
                "dataset.batch(global_batch, drop_remainder=True), if losing the remainder "
                "is fine.",
            )
        )
    return findings
