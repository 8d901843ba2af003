"""What a trace event is (compute, communication, input) and which replica it belongs to.

Two trace shapes are understood:

* **CPU logical devices** (one ``/host:CPU`` plane): TF op events are named
  ``<scope>/<op name>:<OpType>``. Replica k's ops sit under a ``replica_k/`` scope and its
  variable updates under ``update_k/`` (``update_k_<j>`` for the j-th further variable);
  replica 0's forward and backward ops have no scope. The all-reduce is built in a loop
  over replicas, so its per-replica ops (the collective of one ``instance_key``, the
  ``concat`` / ``split`` that pack gradients around it) are named ``<name>`` for replica 0
  and ``<name>_k`` for the next copies, or sit in a ``cond_k`` scope (the all-gather of
  sparse gradients). The index here is only the op's copy number: the breakdown turns
  it into a replica by comparing the copies of one collective
  (``keras_dp_tools.analysis.breakdown.replicas``), since several packs or gathers per replica
  continue the numbering.
  Sparse gradients (``IndexedSlices`` of an ``Embedding``) are all-gathered
  (``CollectiveGatherV2`` of values and indices): kind ``GATHER``. Reductions to one
  device (``ReductionToOneDevice``, ``CentralStorageStrategy``) sum the replicas'
  values with a top-level ``AddN``: kind ``COPY`` shared by all replicas.
* **GPUs**: one ``/device:GPU:<n>`` plane per device; kernels on its ``Stream`` lines
  belong to that device (``gpu_trace`` reads them). NCCL kernels (``nccl`` anywhere in
  the name) are collectives, copies between GPUs (``MemcpyP2P``) are communication,
  host-to-device copies are input, and copies within one GPU or to the host
  (``MemcpyD2D``, ``MemcpyD2H``) are their own kind, as in XProf: neither compute nor
  communication.
"""

from __future__ import annotations

import re
from enum import Enum

from keras_dp_tools.analysis.trace.xspace import TraceEvent


class Kind(str, Enum):
    COMPUTE = "compute"
    COLLECTIVE = "collective"  # all peers must arrive: its time splits into wait + transfer
    COPY = "copy"  # copy-based reduction traffic: all transfer
    GATHER = "gather"  # all-gather of sparse gradients: a collective, accounted apart
    INPUT = "input"
    MEMCPY = "memcpy"  # a copy within one GPU or to the host: counted in other_ms


# Communication of any kind: what allreduce_ms covers.
COMM_KINDS = frozenset({Kind.COLLECTIVE, Kind.COPY, Kind.GATHER})
PEER_KINDS = frozenset({Kind.COLLECTIVE, Kind.GATHER})  # all peers must arrive
# Kinds as small integers (``list(Kind)`` order), for the analysis' span arrays.
KIND_CODES = {kind: code for code, kind in enumerate(Kind)}


COLLECTIVE_OP_TYPES = frozenset(
    {
        "CollectiveReduce",
        "CollectiveReduceV2",
        "CollectiveReduceV3",
        "CollectiveReduceScatterV2",
        "CollectiveBcastSend",
        "CollectiveBcastRecv",
        "CollectiveBcastSendV2",
        "CollectiveBcastRecvV2",
        "CollectiveAllToAllV2",
        "CollectiveAllToAllV3",
        "NcclAllReduce",
        "NcclReduce",
        "NcclBroadcast",
    }
)
GATHER_OP_TYPES = frozenset({"CollectiveGather", "CollectiveGatherV2"})
# Cross-device transfers of ReductionToOneDevice / HierarchicalCopyAllReduce.
COPY_OP_TYPES = frozenset({"_Send", "_Recv", "_HostSend", "_HostRecv"})
INPUT_OP_TYPES = frozenset(
    {
        "IteratorGetNext",
        "IteratorGetNextSync",
        "IteratorGetNextAsOptional",
        "MultiDeviceIteratorGetNextFromShard",
    }
)

_TF_OP = re.compile(r"^(?P<name>[^:\s]+):(?P<type>[A-Za-z_]\w*)$")
_REPLICA_SCOPE = re.compile(r"(?:^|/)(?:replica|update)_(\d+)(?:_\d+)?/")
# Op types TensorFlow creates once per replica around a collective (gradient packing).
PER_REPLICA_COPY_TYPES = frozenset({"ConcatV2", "SplitV", "Split"})
_COPY_SUFFIX = re.compile(r"_(\d+)$")
# A sum of per-replica values on one device, as ReductionToOneDevice (and so
# CentralStorageStrategy) builds it: an AddN outside any model or gradient scope.
_REDUCTION_ADDN = re.compile(
    r"^(?:(?:StatefulPartitionedCall|PartitionedCall|while|body|_\d+)/)*AddN(?:_\d+)?$"
)
# Consumer side of tf.data: the step blocks while these run. (Producer threads prefetch
# in the background and are not counted.)
_INPUT_EVENT = re.compile(r"^(?:\w+GetNext\w*Op::DoCompute|GetNextFromShard(?P<shard>\d+))$")
# CUPTI's copy names (MemcpyP2P, MemcpyD2D, ...); older tools spell them PtoP, DtoD.
_PEER_COPY = re.compile(r"^memcpy\s*(?:p2p|ptop)", re.IGNORECASE)
_HOST_TO_DEVICE = re.compile(r"^memcpy\s*(?:htod|h2d)", re.IGNORECASE)
_LOCAL_COPY = re.compile(r"^memcpy\s*(?:dtod|d2d|dtoh|d2h|other)", re.IGNORECASE)


def op_kind(op_type: str) -> Kind:
    """The kind of a TF op type."""
    if op_type in COLLECTIVE_OP_TYPES:
        return Kind.COLLECTIVE
    if op_type in GATHER_OP_TYPES:
        return Kind.GATHER
    if op_type in COPY_OP_TYPES:
        return Kind.COPY
    if op_type in INPUT_OP_TYPES:
        return Kind.INPUT
    return Kind.COMPUTE


def classify_host_event(event: TraceEvent) -> tuple[Kind, int | None] | None:
    """(kind, replica) of a host event of a CPU-device run; None for events that are not
    TF ops or input waits (executor bookkeeping, Python, allocator events). A replica of
    None means the event serves every replica (shared input)."""
    if event.line == "python":  # eager ops and tracing: host overhead, not device work
        return None
    return classify_host_name(event.name)


def classify_host_name(name: str) -> tuple[Kind, int | None] | None:
    """``classify_host_event`` of an event named ``name`` off the ``python`` line. It
    depends on the name alone, so a trace classifies each event metadata once."""
    op = _TF_OP.match(name)
    if op is None:
        waits = _INPUT_EVENT.match(name)
        if waits is None:
            return None
        shard = waits.group("shard")
        return Kind.INPUT, None if shard is None else int(shard)
    name, kind = op.group("name"), op_kind(op.group("type"))
    scope = _REPLICA_SCOPE.search(name)
    if scope is not None:
        return kind, int(scope.group(1))
    if op.group("type") == "AddN" and _REDUCTION_ADDN.match(name):
        return Kind.COPY, None
    if kind in PEER_KINDS or kind is Kind.INPUT or op.group("type") in PER_REPLICA_COPY_TYPES:
        # Per-replica copies of one op: "<op>" for replica 0, "<op>_k" for replica k.
        suffix = _COPY_SUFFIX.search(name.rsplit("/", 1)[-1])
        return kind, int(suffix.group(1)) if suffix else 0
    return kind, 0


def op_type_of(name: str) -> str:
    """The op type of a TF op event's name (``<scope>/<op name>:<OpType>``); the name
    itself where it is not one (a GPU kernel without its TF op)."""
    op = _TF_OP.match(name)
    return op.group("type") if op else name


def receiving_device(event: TraceEvent) -> str | None:
    """The device a ``_Send`` / ``_Recv`` event's tensor goes to (the side that waits
    for it): its ``key`` stat is the rendezvous key
    ``<src device>;<incarnation>;<dst device>;<edge>;<frame>``."""
    key = event.stats.get("key")
    parts = key.split(";") if isinstance(key, str) else []
    return parts[2] if len(parts) > 2 else None


def scoped_replica(name: str) -> int | None:
    """The replica a ``replica_k/`` or ``update_k/`` scope in an op name names."""
    scope = _REPLICA_SCOPE.search(name)
    return int(scope.group(1)) if scope else None


def copy_number(name: str) -> tuple[str, int]:
    """("scope/op", copy number) of an event named "scope/op_3:Type" (no suffix: 0)."""
    path = name.rsplit(":", 1)[0]
    suffix = _COPY_SUFFIX.search(path)
    return (path[: suffix.start()], int(suffix.group(1))) if suffix else (path, 0)


def classify_device_event(event: TraceEvent) -> Kind:
    """The kind of a kernel or copy on a GPU plane."""
    name = event.name
    if "nccl" in name.lower():  # demangled names can start with "void "
        return Kind.COLLECTIVE
    if _PEER_COPY.match(name):
        return Kind.COPY
    if _HOST_TO_DEVICE.match(name):
        return Kind.INPUT
    if _LOCAL_COPY.match(name):
        return Kind.MEMCPY
    tf_op = event.stats.get("tf_op")
    if isinstance(tf_op, str) and ":" in tf_op:
        kind = op_kind(tf_op.rsplit(":", 1)[1])
        if kind is not Kind.INPUT:
            return kind
    return Kind.COMPUTE
