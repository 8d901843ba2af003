"""The record types and their fields with Arrow types: what the reader expects of every
line (``docs/records.md`` says what each field means)."""

from __future__ import annotations

import pyarrow as pa

from keras_dp_tools.records import columns as schema

RECORD_TYPES = (
    "header",
    "step",
    "window",
    "replica_step",
    "step_breakdown",
    "gpu_status",
    "gpu_sample",
    "cpu_sample",
    "batching_finding",
    "scaling_plan",
    "fit_end",  # StepTimer at the end of a fit (status finished) or at exit inside one
    # StepTimer: the edges of a fit's parts (time, epoch, step), for analysis.fit_time
    "fit_begin",
    "epoch_begin",
    "epoch_end",
    "validation_begin",
    "validation_end",
    "worker_exit",  # keras-dp launch: how each worker process ended (launcher.jsonl)
    "training_loop",  # kdt.TrainingLoop: how a custom loop's steps ran strategy.run
)

# Field name -> Arrow type, per record type. Unknown fields (written by a newer
# version) are still read, with their type inferred.
COMMON_FIELDS: dict[str, pa.DataType] = {
    "type": pa.string(),
    "run": pa.string(),
    "worker": pa.int64(),
    "time": pa.float64(),  # Unix seconds (start of the step for steps)
}
HEADER_FIELDS: dict[str, pa.DataType] = {
    "schema": pa.int64(),
    "hostname": pa.string(),
    "pid": pa.int64(),
    "strategy": pa.string(),
    "replicas": pa.int64(),
    "workers": pa.int64(),
    "devices": pa.list_(pa.string()),
    "global_batch": pa.int64(),
    # argument, fit_batch_size, dataset_shape, dataset_batch_op,
    # per_replica_batch_x_replicas, or "unknown: <why>" (capture.run_info)
    "global_batch_source": pa.string(),
    "steps_per_execution": pa.int64(),
    "keras_package": pa.string(),
    "keras_version": pa.string(),
    "tf_version": pa.string(),
    "python_version": pa.string(),
    "keras_dp_tools_version": pa.string(),
    "embedding_layers": pa.int64(),
    "embedding_names": pa.list_(pa.string()),  # "<layer> (<vocabulary>x<dim>)"
    # How the run id was chosen (capture.job_identity): env, slurm, kubernetes, agreed,
    # local; the cluster's fingerprint (null for one worker); the agreement's cost.
    "run_id_source": pa.string(),
    "cluster": pa.string(),
    "run_id_agreement_ms": pa.float64(),
    # What feeds fit (capture.input_pipeline): the input's kind, its parts that run
    # Python, where it prefetches, serial maps, a PyDataset's workers.
    "input_kind": pa.string(),
    "input_python": pa.list_(pa.string()),
    "input_prefetch": pa.string(),
    "input_serial_maps": pa.int64(),
    "input_workers": pa.int64(),
    "input_multiprocessing": pa.bool_(),
}
STEP_FIELDS: dict[str, pa.DataType] = {  # one record per executed train function call
    "epoch": pa.int64(),
    "step": pa.int64(),  # optimizer.iterations before the call: the first step covered
    "steps": pa.int64(),  # steps covered by the record (steps_per_execution)
    "step_ms": pa.float64(),  # host wall time per step (call time / steps)
    # examples the call trained on (a pass's smaller last batch counted as it is)
    "examples": pa.int64(),
    "examples_per_s": pa.float64(),
    "warmup": pa.bool_(),  # first call of a fit: includes tracing and compilation
}
# Profiler windows and the per-step breakdown (see keras_dp_tools.analysis.breakdown.api).
WINDOW_FIELDS: dict[str, pa.DataType] = {
    "window": pa.int64(),  # index of the window within the callback's life; null if skipped
    "start_step": pa.int64(),
    "end_step": pa.int64(),  # first step after the window
    # window: open, analysed, skipped, failed, foreign (another profiler); fit_end:
    # finished, exited
    "status": pa.string(),
    "reason": pa.string(),
    "steps_analysed": pa.int64(),
    "stop_ms": pa.float64(),  # training-thread time spent stopping the profiler
    "analysis_end": pa.float64(),  # Unix seconds when the background analysis ended
    "trace": pa.string(),  # the .xplane.pb, relative to the log dir
    "profile_run": pa.string(),  # the capture's name in TensorBoard's Profile tab
    "attribution": pa.string(),  # null: replicas read off the trace; else why not
    "sparse_bytes": pa.int64(),  # embedding tables: all-gathered, not all-reduced
    # The run's facts the window was analysed with (keras_dp_tools.records.facts); its
    # devices, global_batch and steps_per_execution are the header's fields.
    "local_replicas": pa.int64(),  # this worker's replicas: the devices in its trace
    "replicas_in_sync": pa.int64(),  # ranks of each collective over all workers
    "steps_covered": pa.list_(pa.list_(pa.int64())),  # [first step, steps] per call
    "exit_code": pa.int64(),  # worker_exit: the process's status (negative: killed by signal)
}
# replica_step and step_breakdown records: the columns of keras_dp_tools.records.columns.
_ARROW_TYPES = {int: pa.int64(), float: pa.float64(), str: pa.string()}
BREAKDOWN_FIELDS: dict[str, pa.DataType] = {
    name: _ARROW_TYPES[kind] for name, kind in schema.BREAKDOWN_FIELDS.items()
}
# GpuMonitor (see keras_dp_tools.capture.monitor.nvml_reader for what the readings mean).
MONITOR_FIELDS: dict[str, pa.DataType] = {
    "gpu_available": pa.bool_(),  # gpu_status: whether GPU readings follow
    "gpu_reason": pa.string(),  # gpu_status: why not
    "gpu_names": pa.list_(pa.string()),
    "gpu_pci_bus_ids": pa.list_(pa.string()),
    "gpu": pa.int64(),  # gpu_sample: index among the strategy's GPUs (TF ordinal order)
    "sampling": pa.string(),  # "poll" (all fields) or "buffer" (driver's util buffer)
    **dict.fromkeys(schema.READING_FIELDS, pa.float64()),  # gpu_sample readings
    "process_cpu_percent": pa.float64(),  # cpu_sample: 100 = one core
    "system_cpu_percent": pa.float64(),
    "cpu_count": pa.int64(),
}
# BatchScalingCheck: findings of kdt.check_batching and the run's kdt.ScalingPlan.
SCALING_FIELDS: dict[str, pa.DataType] = {
    "severity": pa.string(),
    "code": pa.string(),
    "message": pa.string(),
    "fix": pa.string(),
    "plan_rule": pa.string(),
    "plan_replicas": pa.int64(),
    "plan_per_replica_batch": pa.int64(),
    "plan_global_batch": pa.int64(),
    "plan_base_batch": pa.int64(),
    "plan_base_lr": pa.float64(),
    "plan_target_lr": pa.float64(),
    "plan_warmup_steps": pa.int64(),
    "plan_explanation": pa.string(),
}
# kdt.TrainingLoop's training_loop record, besides time, status, step, steps and
# replicas (Report.loops).
TRAINING_LOOP_FIELDS: dict[str, pa.DataType] = {
    "step_function": pa.string(),  # tf.function, eager, run_functions_eagerly, unknown
    "eager_steps": pa.int64(),  # steps whose strategy.run ran outside any tf.function
    "first_eager_step": pa.int64(),
    "traced_run_calls": pa.int64(),  # strategy.run calls while a tf.function was traced
}
FIELDS = {
    **COMMON_FIELDS,
    **HEADER_FIELDS,
    **STEP_FIELDS,
    **WINDOW_FIELDS,
    **BREAKDOWN_FIELDS,
    **MONITOR_FIELDS,
    **SCALING_FIELDS,
    **TRAINING_LOOP_FIELDS,
}
