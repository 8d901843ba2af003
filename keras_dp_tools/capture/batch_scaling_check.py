"""BatchScalingCheck: the batching check before the first step, whether fit trains
data-parallel at all, and the scaling plan."""

from __future__ import annotations

import dataclasses
import linecache
import time

from keras_dp_tools.capture.base import DataParallelCallback, find_in_fit
from keras_dp_tools.capture.recorder import Recorder
from keras_dp_tools.checks.batching import (
    REPLICA_SPLIT_CODES,
    DatasetBatch,
    Finding,
    adapter_batch,
    adapter_distributed_input,
    check_batching,
    dataset_batch,
    is_distributed,
    model_input_ranks,
    unknown_batch,
    warn_findings,
)
from keras_dp_tools.checks.data_parallelism import data_parallelism_findings, read_parallelism
from keras_dp_tools.checks.literal_batch import dataset_batch_products, fit_batch_product
from keras_dp_tools.common.warn import user_frame


class BatchScalingCheck(DataParallelCallback):
    """Checks, when ``fit`` starts, that the model trains data-parallel and that the
    dataset is batched for the replica count.

    Before the first step: when ``fit`` trains one replica while more devices are
    visible (a model built outside ``strategy.scope()``, or a strategy over one device),
    the finding is the ``no-data-parallelism`` error, and no batch change is proposed
    (none would fix it). Otherwise it runs ``kdt.check_batching(dataset,
    model.distribute_strategy, per_replica_batch)``: each problem becomes a
    ``kdt.BatchScalingWarning`` (the classic: ``dataset.batch(64)`` under 4 replicas
    trains with 16 examples per replica). A batch written as a product of numbers in
    your file (``dataset.batch(32 * 4)``, ``fit(batch_size=32 * 4)``) is read from the
    source, so that the fix replaces the hand-written count rather than multiplying
    twice. With a ``log_dir``, the findings and the ``plan`` (a ``kdt.ScalingPlan``)
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
        check_batch: False checks only that fit trains data-parallel (what
            ``kdt.callbacks`` adds when given no dataset, per-replica batch or plan).
    """

    def __init__(
        self,
        dataset=None,
        per_replica_batch: int | None = None,
        log_dir=None,
        plan=None,
        check_batch: bool = True,
    ):
        super().__init__()
        self.dataset = dataset
        self.per_replica_batch = per_replica_batch
        self.log_dir = log_dir
        self.plan = plan
        self.check_batch = check_batch
        self.findings: list[Finding] = []

    def on_train_begin(self, logs=None):
        if self._parameter_servers:  # asynchronous: one replica per worker by design
            parallelism = []
        else:
            parallelism = data_parallelism_findings(read_parallelism(self.model))
        batching = self._batching_findings() if self.check_batch else []
        if parallelism:  # one replica by mistake: no batch for the replica count is right
            batching = [f for f in batching if f.code not in REPLICA_SPLIT_CODES]
        self.findings = parallelism + batching
        warn_findings(self.findings)
        # Checking only parallelism (kdt.callbacks' default), a data-parallel fit leaves
        # nothing to record: no recorder is opened.
        if self.log_dir is not None and (self.check_batch or self.findings):
            self._record()

    def _batching_findings(self) -> list[Finding]:
        strategy = self.model.distribute_strategy
        replicas = int(strategy.num_replicas_in_sync)
        batch = self._fit_batch()
        if batch is None:
            findings = [unknown_batch("fit's data adapter says nothing about its batch")]
        else:
            findings = check_batching(batch, strategy, self.per_replica_batch, warn=False)
        if self.plan is not None and self.plan.replicas != replicas:
            findings.append(
                Finding(
                    "warning",
                    "plan-mismatch",
                    f"The scaling plan is for {self.plan.replicas} replicas, the strategy has "
                    f"{replicas}.",
                    "Make the plan with kdt.plan_scaling(strategy, ...).",
                )
            )
        return findings

    def _fit_batch(self):
        """What the dataset given to us, else fit's data adapter, says about the batch
        fit trains on (a ``DatasetBatch``, with how your code writes its size when that
        is a product of numbers), a distributed dataset, or None."""
        import tensorflow as tf

        if isinstance(self.dataset, DatasetBatch) or is_distributed(self.dataset):
            return self.dataset
        ranks = model_input_ranks(self.model)
        if isinstance(self.dataset, tf.data.Dataset):
            return _with_written_size(dataset_batch(self.dataset, ranks))
        adapter = find_in_fit(_data_adapter)
        if adapter is None:
            return None
        distributed = adapter_distributed_input(adapter)
        if distributed is not None:
            return distributed
        batch = adapter_batch(adapter, ranks)
        return None if batch is None else _with_written_size(batch)

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


def _with_written_size(batch: DatasetBatch) -> DatasetBatch:
    """``batch`` with ``written`` set when the user's code writes its size as a product
    of numbers: ``fit(batch_size=32 * 4)`` on the ``fit`` line, else a ``.batch(32 *
    4)`` of a function on the stack that calls ``fit`` (the nearest few, or the whole
    script) whose product is the size read, written one way only. Nothing is guessed: a
    batch made in a function that has returned, or written otherwise, leaves
    ``written`` None."""
    if not batch.size or batch.source == "generator":
        return batch
    frames = _user_frames()
    if not frames:
        return batch
    if batch.source == "fit":
        frame = frames[0]
        written = fit_batch_product(_source(frame), frame.f_lineno, batch.size)
        path = frame.f_code.co_filename
    else:
        found = {
            (product, frame.f_code.co_filename)
            for frame in frames
            for product in dataset_batch_products(_source(frame), batch.size, _lines(frame))
        }
        written, path = next(iter(found)) if len({p.text for p, _ in found}) == 1 else (None, "")
    if written is None:
        return batch
    return dataclasses.replace(batch, written=dataclasses.replace(written, path=path))


_USER_FRAMES = 4  # the fit call and the few functions around it


def _user_frames() -> list:
    frames, frame = [], user_frame()
    while frame is not None and len(frames) < _USER_FRAMES:
        frames.append(frame)
        frame = frame.f_back
    return frames


def _source(frame) -> str:
    return "".join(linecache.getlines(frame.f_code.co_filename, frame.f_globals))


def _lines(frame) -> tuple[int, int] | None:
    """The lines of the frame's function; None (all) for a module's top level."""
    code = frame.f_code
    if code.co_name == "<module>":
        return None
    last = max((line for _, _, line in code.co_lines() if line is not None), default=0)
    return code.co_firstlineno, max(last, code.co_firstlineno)


def _data_adapter(frame_locals):
    """fit's data adapter, if ``frame_locals`` are those of Keras 3's or tf_keras's fit."""
    adapter = getattr(frame_locals.get("epoch_iterator"), "data_adapter", None)  # Keras 3
    if adapter is None:
        adapter = getattr(frame_locals.get("data_handler"), "_adapter", None)  # tf_keras
    return adapter
