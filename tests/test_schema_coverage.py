"""A recorded field never goes missing from the report. Two sources of fields: every
field the records module declares, and every field a real demo run wrote (read back
from its JSON lines, not from our readers), with its value, in the Report frame of its
record type. Also: the column lists of the presentation name columns that exist.
(tests/test_schema.py checks the same for every column the analysis emits on a GPU
trace, XProf's included.)"""

import json
import math
import re

import numpy as np
import pandas as pd

from keras_dp_tools.analysis.run_frames import FRAME_NAMES
from keras_dp_tools.records import columns as schema
from keras_dp_tools.records.fields import FIELDS
from keras_dp_tools.records.writer import RECORDS_DIRNAME
from keras_dp_tools.report import plots
from keras_dp_tools.report.facade import Report
from keras_dp_tools.report.summary_fields import SUMMARY_FIELDS
from tests.helpers.recorded_runs import COMM_HEAVY, write_run

# Record plumbing, not data: the record's type and the records format's version.
PLUMBING = {"type", "schema"}

# Record types with one Report row per record (the latest record of a key counts):
# type -> (frame, key columns).
ROW_TYPES = {
    "header": ("runs", ["run", "worker"]),
    "gpu_status": ("runs", ["run", "worker"]),
    "step": ("steps", ["run", "worker", "step"]),
    "step_breakdown": ("steps", ["run", "worker", "step"]),
    "replica_step": ("replicas", ["run", "worker", "step", "replica"]),
    "window": ("windows", ["run", "worker", "window", "start_step"]),
    "gpu_sample": ("gpu", ["run", "worker", "gpu", "time"]),
    "cpu_sample": ("cpu", ["run", "worker", "time"]),
    "batching_finding": ("batching", ["run", "worker", "code"]),
}
# A record field shown under another name.
RENAMED = {("step_breakdown", "step_ms"): "trace_step_ms"}
# Fields the frame takes from another record by design: a step row's time and steps are
# its step record's, its replicas the run header's; a run's time is its header's.
# (A step_breakdown's time, like a replica_step's, is its window's start.)
TAKEN_FROM_ANOTHER = {
    ("step_breakdown", "time"),
    ("step_breakdown", "steps"),
    ("step_breakdown", "replicas"),
    ("gpu_status", "time"),
    ("replica_step", "time"),  # the window's start: Report.windows has it
}


def frames(report: Report) -> dict[str, pd.DataFrame]:
    """Every frame of a Report (``RunFrames``' frames)."""
    return {name: getattr(report, name) for name in FRAME_NAMES}


def report_columns(tmp_path) -> set[str]:
    write_run(tmp_path, breakdown=COMM_HEAVY, gpu_util=50.0, batching=[("warning", "x")])
    return set().union(*(frame.columns for frame in frames(Report.load(tmp_path)).values()))


def test_every_declared_record_field_reaches_a_report_frame(tmp_path):
    missing = set(FIELDS) - PLUMBING - report_columns(tmp_path)
    assert missing == set()


def test_every_breakdown_column_is_a_steps_or_replicas_column(tmp_path):
    # From the schema: each column of a step_breakdown / replica_step record.
    write_run(tmp_path)  # no profiler window: the columns are there all the same
    columns = {name: set(frame.columns) for name, frame in frames(Report.load(tmp_path)).items()}
    step_fields = set(schema.STEP_FIELDS) | set(schema.XPROF_FIELDS)
    assert step_fields - {"step_ms"} - columns["steps"] == set()
    assert "trace_step_ms" in columns["steps"] and "xprof_device_compute_ms" in columns["steps"]
    assert set(schema.REPLICA_FIELDS) - columns["replicas"] == set()


def normal(value):
    """A cell as plain Python: lists as tuples, NA as None, numbers as float."""
    if isinstance(value, (list, tuple, np.ndarray)):
        return tuple(normal(item) for item in value)
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return None
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, float, np.number)):
        return float(value)
    return value


def equal(left, right) -> bool:
    left, right = normal(left), normal(right)
    if isinstance(left, float) and isinstance(right, float):
        return math.isclose(left, right, rel_tol=1e-9, abs_tol=1e-9)
    return left == right


def written_records(log_dir) -> dict[str, pd.DataFrame]:
    """The records as the callbacks wrote them, read with json (not our readers)."""
    rows = {}
    for path in sorted((log_dir / RECORDS_DIRNAME).glob("*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            rows.setdefault(record["type"], []).append(record)
    return {kind: pd.DataFrame(listed) for kind, listed in rows.items()}


def test_every_field_a_real_run_wrote_reaches_its_frame_with_its_value(demo_run):
    log_dir, _ = demo_run
    written = written_records(log_dir)
    # The test can fail: the run wrote the row types it is about.
    assert {"header", "step", "step_breakdown", "replica_step", "window"} <= set(written)
    report = frames(Report.load(log_dir))
    lost, differ = [], []
    for kind, (name, keys) in ROW_TYPES.items():
        if kind not in written:
            continue
        rows = written[kind].drop_duplicates(keys, keep="last")
        shown = report[name].drop_duplicates(keys, keep="last")
        merged = rows.merge(shown, on=keys, how="left", suffixes=("", "@report"))
        assert len(merged) == len(rows)
        for field in rows.columns.difference([*keys, *PLUMBING]):
            if (kind, field) in TAKEN_FROM_ANOTHER:
                continue
            column = RENAMED.get((kind, field), field)
            if column not in shown.columns:
                lost.append(f"{kind}.{field}")
                continue
            column = f"{column}@report" if f"{column}@report" in merged else column
            if not all(map(equal, merged[field], merged[column])):
                differ.append(f"{kind}.{field}")
    assert lost == []
    assert differ == []


def test_a_profiled_steps_window_reaches_report_steps(demo_run):
    log_dir, _ = demo_run
    report = Report.load(log_dir)
    analysed = report.windows[report.windows["status"] == "analysed"]
    assert len(analysed)
    expected = pd.Series(pd.NA, index=report.steps.index, dtype="object")
    for window in analysed.itertuples():
        inside = report.steps["step"].between(window.start_step, window.end_step - 1)
        expected[inside & report.steps["trace_step_ms"].notna()] = window.window
    shown = report.steps["window"].astype("object").where(report.steps["window"].notna(), pd.NA)
    assert shown.notna().sum() == expected.notna().sum() > 0
    assert shown.dropna().astype(int).tolist() == expected.dropna().astype(int).tolist()


# The column lists of the presentation name real columns.


def test_tensorboard_window_tags_name_step_columns():
    assert set(schema.WINDOW_SCALARS.values()) - set(schema.STEP_COLUMNS) == set()


def test_stacked_breakdown_parts_are_breakdown_columns():
    assert set(plots._PARTS) - set(schema.MEAN_COLUMNS) == set()


def test_every_summary_field_has_its_label_and_no_label_is_stale(tmp_path):
    write_run(tmp_path, breakdown=COMM_HEAVY, gpu_util=50.0)
    summary = Report.load(tmp_path).summary(advice=False)
    assert set(summary.columns) ^ set(SUMMARY_FIELDS) == set()


def test_the_dashboards_view_of_a_worker_keeps_every_report_frame(tmp_path):
    from keras_dp_tools.report.tensorboard_plugin.data import for_worker

    write_run(tmp_path, breakdown=COMM_HEAVY, gpu_util=50.0, batching=[("warning", "x")])
    report = Report.load(tmp_path)
    view = frames(for_worker(report, 0))
    emptied = [name for name, frame in frames(report).items() if len(frame) and view[name].empty]
    assert emptied == []


def documented_tags(group: str) -> list[str]:
    """The tags docs/dashboard.md lists for one group of TensorBoard scalars."""
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "dashboard.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith(f"| `{group}` |"))
    return re.findall(r"`([a-z_]+)`", row.split("|")[2].split("(")[0])  # not the notes


def test_the_documented_tensorboard_tags_are_the_ones_written():
    from keras_dp_tools.capture.gpu_monitor import SCALAR_FIELDS

    for group in ("dp_window/", "dp_window_other/"):
        written = [
            tag.removeprefix(group) for tag in schema.WINDOW_SCALARS if tag.startswith(group)
        ]
        assert documented_tags(group) == written
    assert documented_tags("gpu/<i>/") == list(SCALAR_FIELDS.values())
    assert set(SCALAR_FIELDS) - set(schema.READING_FIELDS) == set()


def test_csv_and_parquet_exports_hold_every_frame_with_every_column(tmp_path):
    write_run(tmp_path / "logs", breakdown=COMM_HEAVY, gpu_util=50.0)
    report = Report.load(tmp_path / "logs")
    expected = {name: list(frame.columns) for name, frame in frames(report).items()}
    for written, read in (
        (report.to_csv(tmp_path / "csv"), pd.read_csv),
        (report.to_parquet(tmp_path / "parquet"), pd.read_parquet),
    ):
        columns = {path.stem: list(read(path).columns) for path in written}
        assert columns.pop("summary")  # the summary besides the frames
        assert columns == expected
    assert "xprof_device_compute_ms" in expected["steps"]


def test_the_summary_medians_are_the_headline_columns(tmp_path):
    write_run(tmp_path, breakdown=COMM_HEAVY)
    summary = Report.load(tmp_path).summary(advice=False)
    assert set(schema.HEADLINE_COLUMNS) <= set(summary.columns)
    assert summary[list(schema.HEADLINE_COLUMNS)].notna().any().all()  # medians, not blanks
    assert set(schema.HEADLINE_COLUMNS) <= set(schema.MEAN_COLUMNS) | {"busbw_gbps"}


def test_xprofs_fields_map_onto_the_schemas_xprof_columns():
    from keras_dp_tools.analysis.breakdown import xprof_steps

    assert sorted(xprof_steps._COLUMNS.values()) == sorted(schema.XPROF_COLUMNS)


def test_plan_bus_ids_and_exit_code_reach_their_frames_with_their_values(tmp_path):
    from keras_dp_tools.records.writer import (
        LAUNCHER_RECORDS,
        SCHEMA_VERSION,
        RecordWriter,
        records_dir,
        worker_records_path,
    )

    run = {"run": "job-1", "worker": 0}
    writer = RecordWriter(worker_records_path(tmp_path, 0))
    for pid, start in ((100, 1000.0), (200, 2000.0)):  # a restart: a second process
        writer.write({"type": "header", "schema": SCHEMA_VERSION, **run, "time": start, "pid": pid})
        writer.write({"type": "step", **run, "time": start + 1, "epoch": 0, "step": 0, "steps": 1})
    writer.write({"type": "gpu_status", **run, "gpu_pci_bus_ids": ["00000000:17:00.0"]})
    for rule in ("linear", "sqrt"):  # the last plan counts
        writer.write({"type": "scaling_plan", **run, "plan_rule": rule, "plan_replicas": 8})
    writer.close()
    launcher = RecordWriter(records_dir(tmp_path) / LAUNCHER_RECORDS)
    launcher.write({"type": "worker_exit", **run, "time": 2100.0, "exit_code": -9, "reason": "x"})
    launcher.close()

    report = Report.load(tmp_path)

    (row,) = report.runs.to_dict("records")
    assert (row["plan_rule"], row["plan_replicas"]) == ("sqrt", 8)
    assert list(row["gpu_pci_bus_ids"]) == ["00000000:17:00.0"]
    workers = report.workers.set_index("attempt")
    assert workers.loc[1, "exit_code"] == -9  # the launcher's word is on the last attempt
    assert pd.isna(workers.loc[0, "exit_code"])
