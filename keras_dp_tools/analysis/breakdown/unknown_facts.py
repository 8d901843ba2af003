"""The run's facts a trace cannot tell (gradient bytes, replicas in sync, devices): named,
with what their absence leaves out or assumes, rather than guessed silently. The
profiler always knows them; a capture analysed without records may not
(``keras-dp analyze --allreduce-bytes/--replicas-in-sync/--devices`` give them)."""

from __future__ import annotations

from keras_dp_tools.records.facts import RunFacts


def unknown_facts(facts: RunFacts, replica_count: int, on_gpu: bool) -> str | None:
    """The run's facts a trace cannot tell that nobody gave, each with what it leaves
    out or assumes; None when none matters (one replica exchanges nothing)."""
    if replica_count < 2 and not facts.replicas_in_sync:
        return None
    unknown = []
    if facts.allreduce_bytes is None:
        unknown.append(
            "gradient bytes per step (allreduce_bytes; keras-dp analyze --allreduce-bytes): "
            "bandwidths left empty"
        )
    if facts.replicas_in_sync is None:
        unknown.append(
            f"replicas in sync (replicas_in_sync; --replicas-in-sync): taken as the "
            f"{replica_count} replicas of this trace, for the bus bandwidth (a "
            "multi-worker job has more)"
        )
    if facts.devices is None:
        where = "GPUs that ran the model's kernels" if on_gpu else "replica scopes of the ops"
        unknown.append(f"the run's devices: replicas are the {where}")
    return "; ".join(unknown) or None
