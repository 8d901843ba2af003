"""RunFacts: what the analysis needs to know about a run beyond its trace.

The profiler gathers these facts while training, hands them to the analysis with each
window's trace and writes them into the window's record; ``keras-dp analyze`` reads
them back from the records (``from_record``), so both analyse a trace the same way.
Standard library only: the records layer needs no TensorFlow and no pandas.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields


@dataclass(frozen=True)
class RunFacts:
    """The run's facts for the analysis of one trace; None where unknown.

    Attributes:
        worker: the worker whose trace this is (0 without a multi-worker strategy).
        local_replicas: this worker's replicas, the devices in its trace; None: the
            replicas seen in the trace (GPU planes, or ``replica_k`` scopes and
            collective copies on CPU).
        replicas_in_sync: ranks taking part in each collective over all workers
            (``num_replicas_in_sync``), for the bus bandwidth; None: ``local_replicas``.
            Under a multi-worker strategy the peers in other processes are not in this
            trace, so the sync wait only covers this worker's replicas.
        devices: device names of this worker's replicas in order, to label the rows; on
            GPU traces their ordinals choose the planes (``/gpu:2`` is ``/device:GPU:2``).
        global_batch: examples per step over all replicas.
        steps_per_execution: steps each train-function call runs.
        allreduce_bytes: bytes of all trainable variables: what each replica
            all-reduces per step when every gradient is dense; None leaves the
            bandwidth columns empty.
        sparse_bytes: bytes of the variables whose gradients are sparse (embedding
            tables). TF 2.21 all-gathers those instead, so in a step with gathers the
            all-reduce moves ``allreduce_bytes - sparse_bytes``.
        gather_bytes: bytes one step all-gathers (every replica's rows: values and
            indices), the size nccl-tests calls S for an all-gather.
        steps_covered: steps each marked call ran, by its first step (more than one
            under ``steps_per_execution``); steps not listed count the iterations the
            trace's collectives carry (``iter_id``), else 1.

    Example:

    >>> from keras_dp_tools.records.facts import RunFacts
    >>> facts = RunFacts(local_replicas=4, allreduce_bytes=4_000_000, devices=["/gpu:0"])
    >>> facts.ranks(replicas_in_trace=4), facts.devices
    (4, ('/gpu:0',))
    >>> RunFacts.from_record(facts.to_record()) == facts
    True
    """

    worker: int | None = None
    local_replicas: int | None = None
    replicas_in_sync: int | None = None
    devices: tuple[str, ...] | None = None
    global_batch: int | None = None
    steps_per_execution: int | None = None
    allreduce_bytes: int | None = None
    sparse_bytes: int | None = None
    gather_bytes: int | None = None
    steps_covered: Mapping[int, int] = field(default_factory=dict)

    def __post_init__(self):
        # Held as given types of their own: a tuple of device names, a plain dict.
        if self.devices is not None:
            object.__setattr__(self, "devices", tuple(self.devices))
        object.__setattr__(self, "steps_covered", dict(self.steps_covered or {}))

    def ranks(self, replicas_in_trace: int) -> int:
        """Ranks of each collective: ``replicas_in_sync``, else the trace's replicas."""
        return self.replicas_in_sync or replicas_in_trace

    def to_record(self) -> dict:
        """The facts as window record fields (JSON types): ``steps_covered`` as
        ``[first step, steps]`` pairs, JSON objects having only string keys."""
        record = {name: getattr(self, name) for name in RECORD_FIELDS}
        record["devices"] = None if self.devices is None else list(self.devices)
        record["steps_covered"] = [[first, steps] for first, steps in self.steps_covered.items()]
        return record

    @classmethod
    def from_record(cls, record: Mapping) -> RunFacts:
        """The facts a window record holds (as ``to_record`` wrote them, or read back
        by pandas: NaN and NA count as missing); fields it lacks stay unknown.

        Raises:
            ValueError: a field holds something that is not what ``to_record`` writes
                (the message names the field and the value).
        """
        values = {}
        for name in RECORD_FIELDS:
            value = record.get(name)
            if _missing(value):
                continue
            try:
                if name == "devices":
                    values[name] = tuple(str(device) for device in value)
                elif name == "steps_covered":
                    values[name] = {int(first): int(steps) for first, steps in value}
                else:
                    values[name] = _whole_number(value)
            except (TypeError, ValueError):
                raise ValueError(
                    f"The window record's {name!r} is {value!r}, not what keras_dp_tools "
                    "writes there (keras-dp docs records); remove it to analyse without it."
                ) from None
        return cls(**values)


def _missing(value) -> bool:
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    return type(value).__name__ == "NAType"  # pandas' NA, without importing pandas


def _whole_number(value) -> int:
    number = int(value)
    if number != value:
        raise ValueError(value)
    return number


# The window record's fields a RunFacts writes and reads (docs/records.md).
RECORD_FIELDS = tuple(item.name for item in fields(RunFacts))
