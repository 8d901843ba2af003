"""One schema: every column the analysis emits on a real (built) GPU trace, XProf's
included, is recorded and reaches ``Report.steps`` / ``Report.replicas`` with its value;
and XProf failing for real costs only XProf's columns."""

import warnings

import pandas as pd
import pytest

from keras_dp_tools.analysis import analyze_trace
from tests.helpers.gpu_traces import two_gpu_run

GPUS = ["/gpu:0", "/gpu:1"]
# The step record's own columns, which the breakdown's would shadow in Report.steps.
RENAMED = {"step_ms": "trace_step_ms"}
FROM_STEP_RECORD = {"steps", "replicas"}


def record(log_dir, breakdown):
    """Writes the breakdown as DataParallelProfiler does (one record per row)."""
    from keras_dp_tools.capture.recorder import Recorder

    recorder = Recorder.acquire(log_dir, 0)
    try:
        recorder.start_run({"strategy": "MirroredStrategy", "replicas": 2, "devices": GPUS})
        for row in breakdown.replicas.to_dict("records"):
            recorder.write("replica_step", window=0, **row)
        for row in breakdown.steps.to_dict("records"):
            recorder.write("step_breakdown", window=0, **row)
    finally:
        recorder.release()


def same(left: pd.Series, right: pd.Series) -> bool:
    left, right = left.reset_index(drop=True), right.reset_index(drop=True)
    if pd.api.types.is_numeric_dtype(left) or pd.api.types.is_numeric_dtype(right):
        return bool(
            (
                (pd.to_numeric(left) - pd.to_numeric(right)).abs().lt(1e-9)
                | (left.isna() & right.isna())
            ).all()
        )
    return bool(
        (
            left.astype(object).where(left.notna(), None)
            == right.astype(object).where(right.notna(), None)
        ).all()
    )


def test_every_column_the_analysis_emits_reaches_the_report(gpu_trace, tmp_path):
    import keras_dp_tools as kdt

    path = two_gpu_run(gpu_trace).write(tmp_path / "trace")
    breakdown = analyze_trace(path, devices=GPUS, allreduce_bytes=4_000_000)
    # The XProf columns are there and hold XProf's numbers (independent of ours).
    assert breakdown.steps["xprof_device_compute_ms"].notna().all()
    assert breakdown.steps["xprof_device_to_device_ms"].notna().all()
    record(tmp_path / "log", breakdown)
    report = kdt.Report.load(tmp_path / "log")

    steps = report.steps[report.steps["trace_step_ms"].notna()].sort_values("step")
    emitted = breakdown.steps.sort_values("step")
    missing = [c for c in emitted if RENAMED.get(c, c) not in steps.columns]
    assert missing == []
    differ = [
        column
        for column in emitted
        if column not in FROM_STEP_RECORD
        and not same(emitted[column], steps[RENAMED.get(column, column)])
    ]
    assert differ == []

    replicas = report.replicas.sort_values(["step", "replica"])
    emitted = breakdown.replicas.sort_values(["step", "replica"])
    assert [c for c in emitted if c not in replicas.columns] == []
    assert [c for c in emitted if not same(emitted[c], replicas[c])] == []


def test_xprof_failing_leaves_our_columns_and_empties_its_own(gpu_trace, tmp_path, monkeypatch):
    """The converter raises for real (an XSpace it cannot parse): our columns come out
    as they do with XProf working, XProf's are empty, and one warning says why."""
    from xprof.convert import raw_to_tool_data

    from keras_dp_tools.analysis.breakdown import xprof_steps

    path = two_gpu_run(gpu_trace).write(tmp_path / "trace")
    good = analyze_trace(path, devices=GPUS)
    real = raw_to_tool_data.xspace_to_tool_data
    corrupt = tmp_path / "corrupt.xplane.pb"
    corrupt.write_bytes(b"\xff not an XSpace \x00" * 64)

    def on_a_corrupt_file(paths, tool, params):  # XProf itself fails on the bytes
        return real([str(corrupt)], tool, params)

    monkeypatch.setattr(raw_to_tool_data, "xspace_to_tool_data", on_a_corrupt_file)
    monkeypatch.setattr(xprof_steps, "_warned", False)  # once per process: this is the first
    with pytest.warns(xprof_steps.XProfWarning, match="XProf could not") as caught:
        broken = analyze_trace(path, devices=GPUS)
    assert len([w for w in caught if issubclass(w.category, xprof_steps.XProfWarning)]) == 1
    ours = [c for c in good.steps if not c.startswith("xprof_")]
    pd.testing.assert_frame_equal(broken.steps[ours], good.steps[ours])
    assert broken.steps[good.steps.columns.difference(ours)].isna().all().all()
    with warnings.catch_warnings():
        warnings.simplefilter("error", xprof_steps.XProfWarning)
        analyze_trace(path, devices=GPUS)  # a second failing trace: no second warning
