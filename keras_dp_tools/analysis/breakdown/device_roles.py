"""Which devices of a trace are replicas, and what the others did.

A capture made without the run's devices (a log dir of someone else's, a bare
``tf.profiler`` session) may hold GPU planes that ran none of the model's kernels: a
GPU that only received host-to-device copies (seen on a multi-GPU capture where the
model ran on one GPU), or one that ran nothing. Such a device is not a replica: counted
as one it would halve every per-replica mean. It is listed apart, with what it did.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from keras_dp_tools.analysis.breakdown.classify import KIND_CODES, Kind
from keras_dp_tools.analysis.breakdown.intervals import union_lengths
from keras_dp_tools.analysis.trace.xspace import HOST_PLANE_PREFIX

# A device takes part in the training when it ran any of these: kernels, collectives,
# copies to or from its peers. Host-to-device copies and copies within the device (or
# back to the host) alone do not make a replica.
MODEL_KINDS = (Kind.COMPUTE, Kind.COLLECTIVE, Kind.GATHER, Kind.COPY)
DEVICES_APART_COLUMNS = ["device", "events", "busy_ms", "did"]
_WHAT = {
    Kind.INPUT: "host-to-device copies",
    Kind.MEMCPY: "copies within the device or to the host",
}


def gpu_device_name(ordinal: int) -> str:
    """The name a row gives the GPU of a trace's plane ``/device:GPU:<ordinal>``."""
    return f"/device:GPU:{ordinal}"


def host_device_names(space, replica_count: int) -> list[str]:
    """Names for the rows of CPU replicas the run's devices do not name: the host's
    plane (``/host:CPU``), and the replica where it runs several (logical devices
    share its threads, so the trace names no device per op)."""
    host = next(
        (plane.name for plane in space.planes if plane.name.startswith(HOST_PLANE_PREFIX)),
        f"{HOST_PLANE_PREFIX}CPU",
    )
    if replica_count == 1:
        return [host]
    return [f"{host} replica {replica}" for replica in range(replica_count)]


def runs_model(kind: np.ndarray) -> bool:
    """Whether a device's events (kind codes) include any of the model's kernels."""
    return bool(np.isin(kind, [KIND_CODES[k] for k in MODEL_KINDS]).any())


def split_devices(events: Mapping[int, object]) -> tuple[list[int], pd.DataFrame]:
    """The ordinals of the GPUs that ran the model's kernels (the replicas, in order),
    and a frame of the others (``DEVICES_APART_COLUMNS``: the device, its events, the
    time they covered and what they were). ``events``: each GPU's ``DeviceEvents``
    (arrays ``kind``, ``start``, ``end``), by ordinal. Where no GPU ran a kernel, every
    GPU with events is a replica (nothing to tell them apart by)."""
    replicas = [ordinal for ordinal, read in sorted(events.items()) if runs_model(read.kind)]
    if not replicas:
        replicas = [ordinal for ordinal, read in sorted(events.items()) if len(read.kind)]
    rows = [
        _apart_row(ordinal, read)
        for ordinal, read in sorted(events.items())
        if ordinal not in replicas
    ]
    return replicas, pd.DataFrame(rows, columns=DEVICES_APART_COLUMNS)


def no_devices_apart() -> pd.DataFrame:
    return pd.DataFrame([], columns=DEVICES_APART_COLUMNS)


def _apart_row(ordinal: int, read) -> dict:
    count = len(read.kind)
    if not count:
        return {"device": gpu_device_name(ordinal), "events": 0, "busy_ms": 0.0, "did": "nothing"}
    order = np.argsort(read.start, kind="stable")
    busy = int(union_lengths(np.zeros(count, np.int64), read.start[order], read.end[order], 1)[0])
    busy /= 1e9
    codes, counts = np.unique(read.kind, return_counts=True)
    kinds = {list(Kind)[code]: n for code, n in zip(codes.tolist(), counts.tolist(), strict=True)}
    did = ", ".join(f"{n} {_WHAT.get(kind, kind.value)}" for kind, n in sorted(kinds.items()))
    return {"device": gpu_device_name(ordinal), "events": count, "busy_ms": busy, "did": did}
