"""The public names and the records format, compared with a snapshot taken before the
package became layers (commit 2efc041; checked field by field there): a rename, a
dropped name or field, or a field whose type changed fails here.

The snapshot is the record of the format: a new name or field is allowed, and this test
then says which line to add below, so that the next change is measured against it.
"""

import inspect

import pytest

import keras_dp_tools as kdt
from keras_dp_tools.records import columns, fields

# ``kdt.<name>`` -> what it is.
PUBLIC_NAMES = {
    "__version__": "str",
    "Advice": "class",
    "BatchScalingCheck": "class",
    "BatchScalingWarning": "class",
    "Breakdown": "class",
    "DataParallelCallback": "class",
    "DataParallelProfiler": "class",
    "Finding": "class",
    "GpuMonitor": "class",
    "LintViolation": "class",
    "MeasurementWarning": "class",
    "NoGpuWarning": "class",
    "Report": "class",
    "RunAdvisor": "class",
    "ScalingPlan": "class",
    "Severity": "class",
    "StepTimer": "class",
    "StrategyComparison": "class",
    "StrategyWarning": "class",
    "TrainingLoop": "class",
    "analyze_trace": "function",
    "callbacks": "function",
    "check_batching": "function",
    "compare_strategies": "function",
    "configure_devices": "function",
    "find_per_replica_batch": "function",
    "lint_paths": "function",
    "mirrored_strategy": "function",
    "plan_scaling": "function",
    "plots": "module",
    "replica_count": "function",
    "scale_batch_size": "function",
    "scale_learning_rate": "function",
    "tune_allreduce": "function",
    "warmup_schedule": "function",
    "what_if": "function",
}

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
    "fit_end",
    "fit_begin",
    "epoch_begin",
    "epoch_end",
    "validation_begin",
    "validation_end",
    "worker_exit",
    "training_loop",
)

# Every record field -> its Arrow type, as the reader types it (records.fields.FIELDS).
RECORD_FIELDS = {
    "type": "string",
    "run": "string",
    "worker": "int64",
    "time": "double",
    "schema": "int64",
    "hostname": "string",
    "pid": "int64",
    "strategy": "string",
    "replicas": "int64",
    "workers": "int64",
    "devices": "list<item: string>",
    "global_batch": "int64",
    "global_batch_source": "string",
    "steps_per_execution": "int64",
    "keras_package": "string",
    "keras_version": "string",
    "tf_version": "string",
    "python_version": "string",
    "keras_dp_tools_version": "string",
    "embedding_layers": "int64",
    "embedding_names": "list<item: string>",
    "run_id_source": "string",
    "cluster": "string",
    "run_id_agreement_ms": "double",
    "input_kind": "string",
    "input_python": "list<item: string>",
    "input_prefetch": "string",
    "input_serial_maps": "int64",
    "input_workers": "int64",
    "input_multiprocessing": "bool",
    "epoch": "int64",
    "step": "int64",
    "steps": "int64",
    "step_ms": "double",
    "examples": "int64",
    "examples_per_s": "double",
    "warmup": "bool",
    "window": "int64",
    "start_step": "int64",
    "end_step": "int64",
    "status": "string",
    "reason": "string",
    "steps_analysed": "int64",
    "stop_ms": "double",
    "analysis_end": "double",
    "trace": "string",
    "profile_run": "string",
    "attribution": "string",
    "sparse_bytes": "int64",
    # Added with records.facts.RunFacts: the window's facts beside the fields above.
    "local_replicas": "int64",
    "replicas_in_sync": "int64",
    "steps_covered": "list<item: list<item: int64>>",
    "exit_code": "int64",
    "replica": "int64",
    "device": "string",
    "compute_ms": "double",
    "allreduce_ms": "double",
    "sync_wait_ms": "double",
    "transfer_ms": "double",
    "gather_ms": "double",
    "gather_transfer_ms": "double",
    "exposed_allreduce_ms": "double",
    "exposed_sync_wait_ms": "double",
    "exposed_transfer_ms": "double",
    "input_ms": "double",
    "other_ms": "double",
    "dispatch_ms": "double",
    "idle_ms": "double",
    "scheduling_ms": "double",
    "comm_share": "double",
    "wait_share": "double",
    "allreduce_bytes": "int64",
    "gather_bytes": "int64",
    "row_bytes": "int64",
    "algbw_gbps": "double",
    "busbw_gbps": "double",
    "gather_busbw_gbps": "double",
    "bandwidth_note": "string",
    "step_source": "string",
    "max_sync_wait_ms": "double",
    "straggler_replica": "int64",
    "xprof_step_ms": "double",
    "xprof_collectives_ms": "double",
    "xprof_device_compute_ms": "double",
    "xprof_device_to_device_ms": "double",
    "gpu_available": "bool",
    "gpu_reason": "string",
    "gpu_names": "list<item: string>",
    "gpu_pci_bus_ids": "list<item: string>",
    "gpu": "int64",
    "sampling": "string",
    "util_gpu": "double",
    "util_memory": "double",
    "mem_used_gb": "double",
    "mem_total_gb": "double",
    "power_w": "double",
    "sm_clock_mhz": "double",
    "temperature_c": "double",
    "sm_activity": "double",
    "sm_occupancy": "double",
    "tensor_activity": "double",
    "dram_bw_util": "double",
    "nvlink_rx_gbps": "double",
    "nvlink_tx_gbps": "double",
    "process_cpu_percent": "double",
    "system_cpu_percent": "double",
    "cpu_count": "int64",
    "severity": "string",
    "code": "string",
    "message": "string",
    "fix": "string",
    "plan_rule": "string",
    "plan_replicas": "int64",
    "plan_per_replica_batch": "int64",
    "plan_global_batch": "int64",
    "plan_base_batch": "int64",
    "plan_base_lr": "double",
    "plan_target_lr": "double",
    "plan_warmup_steps": "int64",
    "plan_explanation": "string",
    "step_function": "string",
    "eager_steps": "int64",
    "first_eager_step": "int64",
    "traced_run_calls": "int64",
}

# The breakdown's columns, in the frames' order -> their Python type (records.columns).
REPLICA_COLUMNS = {
    "step": "int",
    "replica": "int",
    "device": "str",
    "steps": "int",
    "step_ms": "float",
    "compute_ms": "float",
    "allreduce_ms": "float",
    "sync_wait_ms": "float",
    "transfer_ms": "float",
    "gather_ms": "float",
    "gather_transfer_ms": "float",
    "exposed_allreduce_ms": "float",
    "exposed_sync_wait_ms": "float",
    "exposed_transfer_ms": "float",
    "input_ms": "float",
    "other_ms": "float",
    "dispatch_ms": "float",
    "idle_ms": "float",
    "scheduling_ms": "float",
    "comm_share": "float",
    "wait_share": "float",
    "allreduce_bytes": "int",
    "gather_bytes": "int",
    "row_bytes": "int",
    "algbw_gbps": "float",
    "busbw_gbps": "float",
    "gather_busbw_gbps": "float",
    "bandwidth_note": "str",
    "step_source": "str",
}
STEP_COLUMNS = {
    "step": "int",
    "replicas": "int",
    "steps": "int",
    "step_ms": "float",
    "compute_ms": "float",
    "allreduce_ms": "float",
    "sync_wait_ms": "float",
    "transfer_ms": "float",
    "gather_ms": "float",
    "gather_transfer_ms": "float",
    "exposed_allreduce_ms": "float",
    "exposed_sync_wait_ms": "float",
    "exposed_transfer_ms": "float",
    "input_ms": "float",
    "other_ms": "float",
    "dispatch_ms": "float",
    "idle_ms": "float",
    "scheduling_ms": "float",
    "comm_share": "float",
    "wait_share": "float",
    "max_sync_wait_ms": "float",
    "straggler_replica": "int",
    "allreduce_bytes": "int",
    "gather_bytes": "int",
    "row_bytes": "int",
    "algbw_gbps": "float",
    "busbw_gbps": "float",
    "gather_busbw_gbps": "float",
    "bandwidth_note": "str",
    "step_source": "str",
}
XPROF_COLUMNS = {
    "xprof_step_ms": "float",
    "xprof_collectives_ms": "float",
    "xprof_device_compute_ms": "float",
    "xprof_device_to_device_ms": "float",
}
# The GPU readings of a gpu_sample record, in Report.gpu's order.
READING_FIELDS = (
    "util_gpu",
    "util_memory",
    "mem_used_gb",
    "mem_total_gb",
    "power_w",
    "sm_clock_mhz",
    "temperature_c",
    "sm_activity",
    "sm_occupancy",
    "tensor_activity",
    "dram_bw_util",
    "nvlink_rx_gbps",
    "nvlink_tx_gbps",
)


# strategy_comparison.json (keras_dp_tools/records/comparison.py): its fields, and the
# columns of its table.
COMPARISON_FIELDS = (
    "schema_version",
    "kind",
    "time",
    "table",
    "verdict",
    "best",
    "code",
    "settings",
    "versions",
)
COMPARISON_TABLE_COLUMNS = (
    "candidate",
    "label",
    "status",
    "reason",
    "replicas",
    "global_batch",
    "examples_per_s",
    "spread_pct",
    "speedup",
    "step_ms",
    "comm_ms",
    "comm_share",
    "bytes_per_step",
    "bytes_source",
    "round_examples_per_s",
    "evidence_note",
    "evidence",
)


def kind(value) -> str:
    if inspect.ismodule(value):
        return "module"
    if inspect.isclass(value):
        return "class"
    if inspect.isfunction(value) or inspect.isbuiltin(value):
        return "function"
    return type(value).__name__


def compare(live: dict, snapshot: dict, what: str, where: str) -> None:
    """Fails on a name of ``snapshot`` missing from ``live`` or of another type; on a new
    name, says which lines to add to ``where``; and on a changed order of the old names."""
    missing = sorted(set(snapshot) - set(live))
    changed = {
        name: f"{snapshot[name]} -> {live[name]}"
        for name in snapshot
        if name in live and live[name] != snapshot[name]
    }
    assert not missing, f"{what} removed or renamed (callers and old files use them): {missing}"
    assert not changed, f"{what} changed type: {changed}"
    added = [name for name in live if name not in snapshot]
    assert not added, (
        f"new {what}: add them to {where} in tests/test_api_snapshot.py: "
        + ", ".join(f"{name!r}: {live[name]!r}" for name in added)
    )
    assert [name for name in live if name in snapshot] == list(snapshot), (
        f"{what} in another order than {where}"
    )


def test_public_names_are_todays():
    live = {name: kind(getattr(kdt, name)) for name in kdt.__all__}
    compare(live, PUBLIC_NAMES, "kdt.* names", "PUBLIC_NAMES")


def test_record_types_are_todays():
    compare(
        dict.fromkeys(fields.RECORD_TYPES, "type"),
        dict.fromkeys(RECORD_TYPES, "type"),
        "record types",
        "RECORD_TYPES",
    )


def test_record_fields_and_their_types_are_todays():
    live = {name: str(arrow_type) for name, arrow_type in fields.FIELDS.items()}
    compare(live, RECORD_FIELDS, "record fields", "RECORD_FIELDS")


@pytest.mark.parametrize(
    ("live", "snapshot", "where"),
    [
        (columns.REPLICA_FIELDS, REPLICA_COLUMNS, "REPLICA_COLUMNS"),
        (columns.STEP_FIELDS, STEP_COLUMNS, "STEP_COLUMNS"),
        (columns.XPROF_FIELDS, XPROF_COLUMNS, "XPROF_COLUMNS"),
        (
            dict.fromkeys(columns.READING_FIELDS, float),
            dict.fromkeys(READING_FIELDS, "float"),
            "READING_FIELDS",
        ),
    ],
)
def test_breakdown_and_reading_columns_are_todays(live, snapshot, where):
    typed = {name: python_type.__name__ for name, python_type in live.items()}
    compare(typed, snapshot, "columns", where)


def test_the_comparison_fails_on_a_rename_a_retype_and_an_addition():
    # The test can fail: each kind of change to the format is caught, and named.
    snapshot = {"step": "int64", "step_ms": "double"}
    with pytest.raises(AssertionError, match=r"removed or renamed .*'step_ms'"):
        compare({"step": "int64", "step_time": "double"}, snapshot, "fields", "X")
    with pytest.raises(AssertionError, match=r"changed type: .*'step_ms': 'double -> int64'"):
        compare({"step": "int64", "step_ms": "int64"}, snapshot, "fields", "X")
    with pytest.raises(AssertionError, match=r"add them to X .*'steps': 'int64'"):
        compare({**snapshot, "steps": "int64"}, snapshot, "fields", "X")
    with pytest.raises(AssertionError, match="another order"):
        compare({"step_ms": "double", "step": "int64"}, snapshot, "fields", "X")
    compare(dict(snapshot), snapshot, "fields", "X")


def test_the_strategy_comparison_record_is_todays():
    from keras_dp_tools.analysis.strategies import TABLE_COLUMNS
    from keras_dp_tools.records import comparison

    live = dict.fromkeys(comparison.COMPARISON_FIELDS, "field")
    compare(live, dict.fromkeys(COMPARISON_FIELDS, "field"), "fields", "COMPARISON_FIELDS")
    columns = dict.fromkeys([*TABLE_COLUMNS, "evidence"], "column")
    compare(
        columns,
        dict.fromkeys(COMPARISON_TABLE_COLUMNS, "column"),
        "comparison table columns",
        "COMPARISON_TABLE_COLUMNS",
    )
