"""BatchScalingCheck: the batching check before the first step, and the scaling plan."""

from __future__ import annotations

import time

from keras_dp_tools.capture.base import DataParallelCallback, find_in_fit
from keras_dp_tools.capture.recorder import Recorder
from keras_dp_tools.checks.batching import (
    DatasetBatch,
    Finding,
    adapter_batch,
    adapter_distributed_input,
    check_batching,
    is_distributed,
    unknown_batch,
    warn_findings,
)


class BatchScalingCheck(DataParallelCallback):
    """Checks, when ``fit`` starts, that the dataset is batched for the replica count.

    Runs ``kdt.check_batching(dataset, model.distribute_strategy, per_replica_batch)``
    before the first step: each problem becomes a ``kdt.BatchScalingWarning`` (the
    classic: ``dataset.batch(64)`` under 4 replicas trains with 16 examples per
    replica). With a ``log_dir``, the findings and the ``plan`` (a ``kdt.ScalingPlan``)
    also go to the records (``Report.batching``) and to TensorBoard's Text tab.

    Example:

    ```python
    import keras_dp_tools as kdt

    plan = kdt.plan_scaling(strategy, per_replica_batch=64, base_lr=0.1, base_batch=256)
    dataset = dataset.batch(plan.global_batch)
    model.fit(dataset, epochs=3, callbacks=[
        kdt.BatchScalingCheck(dataset, per_replica_batch=64, log_dir="runs/exp1", plan=plan)])
    ```

    Args:
        dataset: the ``tf.data.Dataset`` given to ``fit``. None (or arrays): the batch
            ``fit`` makes of its input is read from its data adapter, e.g. the
            ``batch_size`` of ``fit(x, y, batch_size=64)``; when it cannot be read, the
            finding is ``unknown-batch``.
        per_replica_batch: the examples per replica you intend (enables the
            missing-multiply check).
        log_dir: run folder for records and TensorBoard; None only warns.
        plan: a ``kdt.ScalingPlan`` to log; its replica count is checked too.
    """

    def __init__(self, dataset=None, per_replica_batch: int | None = None, log_dir=None, plan=None):
        super().__init__()
        self.dataset = dataset
        self.per_replica_batch = per_replica_batch
        self.log_dir = log_dir
        self.plan = plan
        self.findings: list[Finding] = []

    def on_train_begin(self, logs=None):
        strategy = self.model.distribute_strategy
        replicas = int(strategy.num_replicas_in_sync)
        batch = self._fit_batch()
        if batch is None:
            self.findings = [unknown_batch("fit's data adapter says nothing about its batch")]
        else:
            self.findings = check_batching(batch, strategy, self.per_replica_batch, warn=False)
        if self.plan is not None and self.plan.replicas != replicas:
            self.findings.append(
                Finding(
                    "warning",
                    "plan-mismatch",
                    f"The scaling plan is for {self.plan.replicas} replicas, the strategy has "
                    f"{replicas}.",
                    "Make the plan with kdt.plan_scaling(strategy, ...).",
                )
            )
        warn_findings(self.findings)
        if self.log_dir is not None:
            self._record()

    def _fit_batch(self):
        """The dataset given to us, else what fit's data adapter says about the batch it
        makes of fit's input (a ``DatasetBatch``, or None)."""
        import tensorflow as tf

        if isinstance(self.dataset, (tf.data.Dataset, DatasetBatch)) or is_distributed(
            self.dataset
        ):
            return self.dataset
        adapter = find_in_fit(_data_adapter)
        if adapter is None:
            return None
        distributed = adapter_distributed_input(adapter)
        return distributed if distributed is not None else adapter_batch(adapter)

    def _record(self) -> None:
        recorder = Recorder.for_fit(self.log_dir, self.model)
        try:
            now = time.time()
            for finding in self.findings:
                recorder.write(
                    "batching_finding",
                    time=now,
                    severity=finding.severity,
                    code=finding.code,
                    message=finding.message,
                    fix=finding.fix,
                )
            if self.plan is not None:
                recorder.write("scaling_plan", time=now, **self.plan.to_record())
                recorder.text("keras_dp/scaling_plan", self.plan.to_markdown())
            if self.findings:
                lines = [f"- **{f.severity}** {f.message} *Fix:* {f.fix}" for f in self.findings]
                recorder.text("keras_dp/batching", "\n".join(lines))
        finally:
            recorder.release()


def _data_adapter(frame_locals):
    """fit's data adapter, if ``frame_locals`` are those of Keras 3's or tf_keras's fit."""
    adapter = getattr(frame_locals.get("epoch_iterator"), "data_adapter", None)  # Keras 3
    if adapter is None:
        adapter = getattr(frame_locals.get("data_handler"), "_adapter", None)  # tf_keras
    return adapter
