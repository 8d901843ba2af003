"""Batch-size scaling by replica count.

A batch given to ``fit`` under a distribution strategy is the *global* batch: it is
split over ``strategy.num_replicas_in_sync`` replicas. Forgetting to multiply by
the replica count silently shrinks every replica's batch.
"""

from __future__ import annotations

import numbers


def require_positive_int(name: str, value) -> int:
    """``value`` as an int if it is a positive integer, else a ValueError naming it."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1:
        return int(value)
    raise ValueError(f"{name} must be a positive integer, received {value!r}.")


def replica_count(strategy_or_replicas) -> int:
    """Replicas of a ``tf.distribute`` strategy, or the given positive int itself."""
    if hasattr(strategy_or_replicas, "num_replicas_in_sync"):
        return require_positive_int(
            "num_replicas_in_sync", strategy_or_replicas.num_replicas_in_sync
        )
    if isinstance(strategy_or_replicas, numbers.Integral) and not isinstance(
        strategy_or_replicas, bool
    ):
        return require_positive_int("The replica count", strategy_or_replicas)
    raise TypeError(
        "Expected a tf.distribute strategy or a replica count (int), received "
        f"{strategy_or_replicas!r} of type {type(strategy_or_replicas).__name__}."
    )


def scale_batch_size(per_replica_batch: int, strategy_or_replicas) -> int:
    """Global batch size for ``per_replica_batch`` examples on each replica.

    Example:

    ```python
    >>> import keras_dp_tools as kdt
    >>> kdt.scale_batch_size(64, 4)
    256
    ```
    With a strategy: ``dataset.batch(kdt.scale_batch_size(64, strategy))``.

    Args:
        per_replica_batch: examples each replica processes per step (positive int).
        strategy_or_replicas: a ``tf.distribute.Strategy`` or the replica count.

    Returns:
        ``per_replica_batch * num_replicas_in_sync``: the batch size to give
        ``dataset.batch`` or ``fit(batch_size=...)``.
    """
    per_replica_batch = require_positive_int("per_replica_batch", per_replica_batch)
    return per_replica_batch * replica_count(strategy_or_replicas)
