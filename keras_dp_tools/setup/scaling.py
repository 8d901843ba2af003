"""Batch-size and learning-rate scaling by replica count.

A batch given to ``fit`` under a distribution strategy is the *global* batch: it is
split over ``strategy.num_replicas_in_sync`` replicas. Forgetting to multiply by
the replica count silently shrinks every replica's batch.
"""

from __future__ import annotations

import numbers
from dataclasses import asdict, dataclass

from keras_dp_tools.common.validation import require_positive_int, require_positive_number


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


SCALING_RULES = ("linear", "sqrt", "none")


def scale_learning_rate(
    base_lr: float, global_batch: int, base_batch: int, rule: str = "linear"
) -> float:
    """The learning rate for ``global_batch`` given one tuned for ``base_batch``.

    Rules: ``"linear"`` multiplies by ``global_batch / base_batch`` (Goyal et al. 2017,
    arXiv:1706.02677; usual with SGD, with a warm-up); ``"sqrt"`` by its square root
    (Krizhevsky 2014, arXiv:1404.5997; Hoffer et al. 2017; usual for Adam-type
    optimizers); ``"none"`` keeps ``base_lr``.

    Example:

    ```python
    >>> import keras_dp_tools as kdt
    >>> kdt.scale_learning_rate(0.1, global_batch=1024, base_batch=256)
    0.4
    >>> kdt.scale_learning_rate(1e-3, global_batch=1024, base_batch=256, rule="sqrt")
    0.002

    ```

    Args:
        base_lr: the learning rate that works at ``base_batch``.
        global_batch: the batch over all replicas you train with now.
        base_batch: the (global) batch ``base_lr`` was tuned for.
        rule: ``"linear"``, ``"sqrt"`` or ``"none"``.
    """
    base_lr = require_positive_number("base_lr", base_lr)
    ratio = require_positive_int("global_batch", global_batch) / require_positive_int(
        "base_batch", base_batch
    )
    if rule == "linear":
        return base_lr * ratio
    if rule == "sqrt":
        return base_lr * ratio**0.5
    if rule == "none":
        return base_lr
    raise ValueError(f"rule must be one of {', '.join(SCALING_RULES)}; received {rule!r}.")


@dataclass(frozen=True)
class ScalingPlan:
    """How a run scales batch and learning rate with its replicas (see ``plan_scaling``).

    Attributes:
        rule: ``"linear"``, ``"sqrt"`` or ``"none"``.
        replicas, per_replica_batch, global_batch: the batch over replicas.
        base_batch, base_lr: the setting the learning rate was tuned at.
        target_lr: the learning rate after warm-up.
        warmup_steps: steps of linear warm-up from ``base_lr`` to ``target_lr`` (0: none).
        explanation: one paragraph saying all of the above in words.
    """

    rule: str
    replicas: int
    per_replica_batch: int
    global_batch: int
    base_batch: int
    base_lr: float
    target_lr: float
    warmup_steps: int
    explanation: str

    def schedule(self, after=None, keras_package: str | None = None):
        """The learning-rate schedule of this plan: ``warmup_schedule`` from ``base_lr``
        to ``target_lr`` over ``warmup_steps``, then ``after`` (or constant)."""
        from keras_dp_tools.setup.schedules import warmup_schedule

        if self.warmup_steps == 0 and after is None:
            return self.target_lr
        return warmup_schedule(
            self.target_lr,
            max(self.warmup_steps, 1),
            start_lr=self.base_lr,
            after=after,
            keras_package=keras_package,
        )

    def to_record(self) -> dict:
        """The plan as record fields (``scaling_plan`` records)."""
        return {f"plan_{name}": value for name, value in asdict(self).items()}

    def to_markdown(self) -> str:
        """A table and the explanation, for TensorBoard's text tab and notebooks."""
        rows = [
            f"| {name} | {value} |" for name, value in asdict(self).items() if name != "explanation"
        ]
        return "\n".join(["| setting | value |", "|---|---|", *rows, "", self.explanation])


def plan_scaling(
    strategy_or_replicas,
    per_replica_batch: int,
    base_lr: float,
    base_batch: int,
    rule: str = "linear",
    warmup_epochs: float = 0,
    steps_per_epoch: int | None = None,
) -> ScalingPlan:
    """Plans batch size, learning rate and warm-up for a replica count.

    Example:

    ```python
    >>> import keras_dp_tools as kdt
    >>> plan = kdt.plan_scaling(8, per_replica_batch=128, base_lr=0.1, base_batch=256,
    ...                         warmup_epochs=5, steps_per_epoch=100)
    >>> plan.global_batch, plan.target_lr, plan.warmup_steps
    (1024, 0.4, 500)

    ```
    Then ``dataset.batch(plan.global_batch)`` and
    ``keras.optimizers.SGD(learning_rate=plan.schedule())``.

    Args:
        strategy_or_replicas: a ``tf.distribute`` strategy or the replica count.
        per_replica_batch: examples per replica per step.
        base_lr: a learning rate known to work at ``base_batch``.
        base_batch: the global batch ``base_lr`` was tuned for.
        rule: ``"linear"`` (SGD), ``"sqrt"`` (Adam-type) or ``"none"``.
        warmup_epochs: epochs of linear warm-up from ``base_lr`` (Goyal et al. use 5
            with the linear rule); needs ``steps_per_epoch``.
        steps_per_epoch: steps per epoch, to turn warm-up epochs into steps.
    """
    replicas = replica_count(strategy_or_replicas)
    global_batch = scale_batch_size(per_replica_batch, replicas)
    target_lr = scale_learning_rate(base_lr, global_batch, base_batch, rule)
    if not isinstance(warmup_epochs, numbers.Real) or warmup_epochs < 0:
        raise ValueError(f"warmup_epochs must be a number >= 0, received {warmup_epochs!r}.")
    if warmup_epochs and steps_per_epoch is None:
        raise ValueError(
            f"warmup_epochs={warmup_epochs} needs steps_per_epoch to know how many steps "
            "that is; pass steps_per_epoch=len(dataset) or the value you give fit."
        )
    warmup_steps = (
        round(warmup_epochs * require_positive_int("steps_per_epoch", steps_per_epoch))
        if warmup_epochs
        else 0
    )
    ratio = global_batch / base_batch
    how = {
        "linear": f"multiplied by the batch ratio {ratio:g} (linear rule, Goyal et al. 2017)",
        "sqrt": f"multiplied by the square root of the batch ratio, {ratio**0.5:.4g} "
        "(square-root rule, Krizhevsky 2014 / Hoffer et al. 2017)",
        "none": "kept as it is (no scaling rule)",
    }[rule]
    warmup = (
        f" It ramps up linearly from {base_lr:g} over the first {warmup_steps} steps "
        f"({warmup_epochs:g} epochs), so the first updates at the larger rate do not diverge."
        if warmup_steps
        else " There is no warm-up."
    )
    explanation = (
        f"{replicas} replicas x {per_replica_batch} examples = a global batch of "
        f"{global_batch} per step. The learning rate {base_lr:g}, tuned for a batch of "
        f"{base_batch}, is {how}: {target_lr:.6g}.{warmup}"
    )
    return ScalingPlan(
        rule=rule,
        replicas=replicas,
        per_replica_batch=per_replica_batch,
        global_batch=global_batch,
        base_batch=base_batch,
        base_lr=float(base_lr),
        target_lr=target_lr,
        warmup_steps=warmup_steps,
        explanation=explanation,
    )
