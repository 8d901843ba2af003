"""The columns of the step breakdown, defined once: the analysis emits them, the records
store them (with these types), ``Report.steps`` / ``.replicas`` show them, and the
TensorBoard tags name them; and the fields of the monitor's and the batching check's
records as ``Report`` reads them. Standard library only, so every layer may import it.

Types are Python's (``int``, ``float``, ``str``); ``keras_dp_tools.records.fields`` maps them
to Arrow types. Order is the order of the frames' columns.
"""

from __future__ import annotations

# What feeds fit, in the run header (capture.input_pipeline fills them; Report.runs
# shows them): the input's kind, its parts that run Python, where it prefetches, its
# serial maps, a PyDataset's workers.
INPUT_FIELDS = (
    "input_kind",
    "input_python",
    "input_prefetch",
    "input_serial_maps",
    "input_workers",
    "input_multiprocessing",
)

# One row per profiled step and replica (``Breakdown.replicas``, ``replica_step``
# records, ``Report.replicas``).
REPLICA_FIELDS: dict[str, type] = {
    "step": int,
    "replica": int,
    "device": str,
    "steps": int,  # steps the row covers (steps_per_execution)
    "step_ms": float,
    # Times per step: the step row averages these over replicas (MEAN_COLUMNS).
    "compute_ms": float,
    "allreduce_ms": float,
    "sync_wait_ms": float,
    "transfer_ms": float,
    "gather_ms": float,
    "gather_transfer_ms": float,
    "exposed_allreduce_ms": float,
    "exposed_sync_wait_ms": float,
    "exposed_transfer_ms": float,
    "input_ms": float,
    "other_ms": float,
    "dispatch_ms": float,
    "idle_ms": float,
    "scheduling_ms": float,
    "comm_share": float,
    "wait_share": float,
    # Sizes and bandwidths.
    "allreduce_bytes": int,
    "gather_bytes": int,
    "row_bytes": int,
    "algbw_gbps": float,
    "busbw_gbps": float,
    "gather_busbw_gbps": float,
    "bandwidth_note": str,  # why the bandwidths are empty, if they are
    # Where the step came from: our markers, tf_keras's or Keras 3's, XProf's step
    # grouping, or the whole capture (analysis.breakdown.step_sources.STEP_SOURCES).
    "step_source": str,
}
REPLICA_COLUMNS = list(REPLICA_FIELDS)
_SIZES = REPLICA_COLUMNS.index("allreduce_bytes")  # sizes and bandwidths from here on
MEAN_COLUMNS = REPLICA_COLUMNS[
    REPLICA_COLUMNS.index("compute_ms") : REPLICA_COLUMNS.index("wait_share") + 1
]

# One row per profiled step (``Breakdown.steps``, ``step_breakdown`` records, the
# breakdown columns of ``Report.steps``).
STEP_FIELDS: dict[str, type] = {
    "step": int,
    "replicas": int,
    "steps": int,
    "step_ms": float,
    **{name: REPLICA_FIELDS[name] for name in MEAN_COLUMNS},
    "max_sync_wait_ms": float,
    "straggler_replica": int,
    # The replica rows' sizes and bandwidths, for the step as a whole.
    **{name: REPLICA_FIELDS[name] for name in REPLICA_COLUMNS[_SIZES:]},
}
STEP_COLUMNS = list(STEP_FIELDS)

# XProf's own per-step numbers, added to the step rows of GPU traces.
XPROF_FIELDS: dict[str, float] = {
    "xprof_step_ms": float,
    "xprof_collectives_ms": float,
    "xprof_device_compute_ms": float,
    "xprof_device_to_device_ms": float,
}
XPROF_COLUMNS = list(XPROF_FIELDS)

# Every field of replica_step and step_breakdown records.
BREAKDOWN_FIELDS: dict[str, type] = {**REPLICA_FIELDS, **STEP_FIELDS, **XPROF_FIELDS}

# One GPU reading of GpuMonitor (``gpu_sample`` records, ``Report.gpu``), besides time
# and gpu; all floats (percent, GB, W, MHz, Celsius, GB/s). See
# keras_dp_tools.capture.monitor.nvml_reader for what each means.
READING_FIELDS = (
    "util_gpu",  # percent of time any kernel ran
    "util_memory",
    "mem_used_gb",
    "mem_total_gb",
    "power_w",
    "sm_clock_mhz",
    "temperature_c",
    "sm_activity",  # GPM: percent of SMs busy
    "sm_occupancy",
    "tensor_activity",
    "dram_bw_util",
    "nvlink_rx_gbps",
    "nvlink_tx_gbps",
)

# The fields of other record types, as the report's frames hold them (``Report.gpu``,
# ``.cpu``, ``.batching``, and the GPU status merged into ``Report.runs``).
GPU_STATUS_COLUMNS = ["gpu_available", "gpu_reason", "gpu_names", "gpu_pci_bus_ids"]
GPU_SAMPLE_COLUMNS = ["run", "worker", "gpu", "time", "sampling", *READING_FIELDS]
CPU_SAMPLE_COLUMNS = [
    "run",
    "worker",
    "time",
    "process_cpu_percent",
    "system_cpu_percent",
    "cpu_count",
]
BATCHING_FINDING_COLUMNS = ["run", "worker", "time", "severity", "code", "message", "fix"]

# The breakdown's headline columns: the medians of ``Report.summary()`` and the
# TensorBoard window scalars (the records keep every column).
HEADLINE_COLUMNS = (
    "compute_ms",
    "allreduce_ms",
    "gather_ms",
    "exposed_allreduce_ms",
    "sync_wait_ms",
    "input_ms",
    "other_ms",
    "comm_share",
    "wait_share",
    "busbw_gbps",
)

# TensorBoard scalars written per analysed step, tag -> column: groups of their own, as
# they have points only inside profiler windows. The split of other_ms has its own group
# so that no group overflows TensorBoard's page.
WINDOW_SCALARS = {
    **{f"dp_window/{name}": name for name in HEADLINE_COLUMNS},
    **{f"dp_window_other/{name}": name for name in ("dispatch_ms", "idle_ms", "scheduling_ms")},
}
