"""The columns of a run's frames (``RunFrames``, ``Report``): one list per frame, named
after the frame it describes.

Constants only; no TensorFlow.
"""

from __future__ import annotations

from keras_dp_tools.records import columns as schema
from keras_dp_tools.records.fields import SCALING_FIELDS

# The last scaling plan a run recorded (kdt.plan_scaling / BatchScalingCheck(plan=...)).
PLAN_COLUMNS = [name for name in SCALING_FIELDS if name.startswith("plan_")]
RUN_COLUMNS = [
    "run",
    "worker",
    "workers",
    "time",
    "hostname",
    "pid",
    "strategy",
    "replicas",
    "devices",
    "global_batch",
    "global_batch_source",  # where global_batch came from (capture.run_info)
    "steps_per_execution",
    "keras_package",
    "keras_version",
    "tf_version",
    "python_version",
    "keras_dp_tools_version",
    "embedding_layers",
    "embedding_names",
    *schema.INPUT_FIELDS,  # what feeds fit (capture.input_pipeline)
    # How the run id was chosen (capture.job_identity) and, for runs merged on load
    # (analysis.jobs), the id the header was recorded under.
    "run_id_source",
    "cluster",
    "run_id_agreement_ms",
    "recorded_run",
    *schema.GPU_STATUS_COLUMNS,
    *PLAN_COLUMNS,
    "source",
]
# The step records' columns of Report.steps (StepTimer's), with the run header's
# replicas and global batch and the profiled mark.
TIMED_STEP_COLUMNS = [
    "run",
    "worker",
    "epoch",
    "step",
    "steps",
    "replicas",
    "global_batch",
    "step_ms",
    "examples",
    "examples_per_s",
    "warmup",
    "profiled",
    "time",
]
# What the profiler's step_breakdown records add to each step ("trace_step_ms" is the
# step as the trace marks it; "step_ms" stays the host wall time of StepTimer).
# Every column the analysis emits per step (keras_dp_tools.records.columns) reaches the report.
BREAKDOWN_COLUMNS = [
    "trace_step_ms",
    "window",  # the index of the profiler window whose trace gave the row
    # compute_ms ... bandwidth_note, per step, averaged over replicas ("steps" and
    # "step_ms" are the step record's own; "replicas" comes from the run header).
    *[name for name in schema.STEP_COLUMNS if name not in ("step", "replicas", "steps", "step_ms")],
    *schema.XPROF_COLUMNS,
]
# Where GpuMonitor ran: mean utilization of the GPUs over the step (see Report.gpu).
MONITOR_COLUMNS = ["gpu_util_mean"]
# Report.replicas: the replica_step records, with the window index that gave them.
REPLICA_FRAME_COLUMNS = ["run", "worker", "window", *schema.REPLICA_COLUMNS]
WINDOW_COLUMNS = [
    "run",
    "worker",
    "window",  # the window's index (null if skipped)
    "start_step",
    "end_step",
    "status",
    "reason",
    "steps_analysed",
    "stop_ms",
    "analysis_end",
    "allreduce_bytes",
    "sparse_bytes",
    "gather_bytes",
    # The rest of the run's facts the window was analysed with (records.facts.RunFacts).
    "local_replicas",
    "replicas_in_sync",
    "devices",
    "global_batch",
    "steps_per_execution",
    "steps_covered",
    "attribution",
    "profile_run",
    "trace",
    "time",
    "source",
]
# One row per training_loop record of kdt.TrainingLoop (how a custom loop's steps called
# strategy.run; the latest record of a run and worker counts).
LOOP_COLUMNS = [
    "run",
    "worker",
    "time",
    "status",
    "step",
    "steps",
    "step_function",
    "eager_steps",
    "first_eager_step",
    "traced_run_calls",
    "replicas",
]
