"""The advisor, compare(), exports and the report CLI on recorded runs; the advice in
TensorBoard after a real fit."""

import pandas as pd
import pytest

import keras_dp_tools as kdt
from tests.helpers.processes import run_cli
from tests.helpers.recorded_runs import (
    BALANCED,
    COMM_HEAVY,
    HOST_BOUND,
    INPUT_BOUND,
    SPARSE,
    WAITING,
    write_records,
    write_run,
    write_scaling_runs,
)
from tests.helpers.training import GLOBAL_BATCH, dense_model, fit


def titles(report):
    return [item.title for item in report.advice()]


def test_communication_bound_run(tmp_path):
    write_run(tmp_path, breakdown=COMM_HEAVY, embedding_layers=1)
    advice = kdt.Report.load(tmp_path).advice()

    # A symptom, not a broken run: a warning, ranked first by the ms it explains.
    assert advice[0].severity == "warning" and advice[0].title.startswith("Communication-bound")
    assert "35% of the step" in advice[0].evidence and "40.0 MB" in advice[0].evidence
    assert "num_packs" in advice[0].fix and "mixed_float16" in advice[0].fix
    # An embedding layer without all-gathers in the trace (densified) is not a finding.
    assert not any("IndexedSlices" in item.evidence for item in advice)


def test_embedding_advice_from_the_gathers_in_the_trace(tmp_path):
    """Gathers take 15% of the step while the comm share is 5%: the finding does not
    wait for a communication-bound run, and names the layer and what to do."""
    write_run(tmp_path, breakdown=SPARSE, embedding_layers=1, embedding_names=["words (50000x64)"])
    (advice,) = kdt.Report.load(tmp_path).advice()
    assert advice.severity == "warning"
    assert advice.title == "Embedding gradients are all-gathered (words (50000x64))"
    assert "CollectiveGatherV2" in advice.evidence and "15% of the step" in advice.evidence
    assert "0.08 MB gathered per step against 12.8 MB" in advice.evidence
    assert "tf.convert_to_tensor" in advice.fix and "Efficient allreduce" in advice.fix


def test_other_time_dominating_names_its_largest_part(tmp_path):
    write_run(tmp_path, breakdown=HOST_BOUND)
    found = {item.code: item for item in kdt.Report.load(tmp_path).advice()}
    advice = found["other-time"]
    # other = 10 - 3 - 0.5 - 0.2 = 6.3 ms (63%), half of it dispatch.
    assert advice.title == "Most of the step is outside compute and communication"
    assert "63% of the step" in advice.evidence and "dispatch 3.15 ms" in advice.evidence
    assert "steps_per_execution" in advice.fix
    assert advice.explains_ms_per_step == pytest.approx(6.3)
    # 3 ms of compute in a 10 ms step of 4 replicas: too little work, ranked first, as
    # it explains the other time and the all-reduce's latency beyond its transfer.
    assert list(found) == ["too-little-work", "other-time"]
    assert found["too-little-work"].explains_ms_per_step >= 6.3
    # 4x the per-replica batch: 4 x 3 ms compute + the 0.5 ms exposed all-reduce + the
    # 6.5 ms rest = 19 ms for 4x the examples of a 10 ms step: 40 / 19 = 2.1x.
    assert "at 64 examples per replica what_if predicts 2.1x the examples/s" in (
        found["too-little-work"].evidence
    )


def test_balanced_run_has_no_findings(tmp_path):
    write_run(tmp_path, breakdown=BALANCED, gpu_util=90.0)
    assert titles(kdt.Report.load(tmp_path)) == []


def test_waiting_and_a_straggler(tmp_path):
    write_run(tmp_path, breakdown=WAITING, stragglers=[2, 2, 2, 1, 2])
    found = titles(kdt.Report.load(tmp_path))
    # Ranked by what each explains: the slowest replica's wait (max_sync_wait_ms) is
    # longer than the mean exposed wait of all replicas.
    assert found == ["Replica 2 is a straggler", "Replicas wait for each other at the all-reduce"]


def cpu_samples(busy_percent, cores=2, run="r1"):
    """Host CPU readings of a CPU-only run (no GPU records), every 0.1 s."""
    return [
        {"type": "cpu_sample", "run": run, "worker": 0, "time": 1000.0 + 0.1 * k,
         "process_cpu_percent": busy_percent * cores, "system_cpu_percent": busy_percent,
         "cpu_count": cores}
        for k in range(20)
    ]  # fmt: skip


def test_saturated_cpu_cores_are_a_caveat_above_the_findings(tmp_path):
    # The demo's case: replicas on logical CPU devices share the cores. That is said
    # once, above the findings; the findings themselves are not rewritten or demoted.
    path = write_run(tmp_path / "shared", breakdown=WAITING, stragglers=[2, 2, 2, 1, 2])
    write_records(path, cpu_samples(busy_percent=95.0))
    shared = kdt.Report.load(tmp_path / "shared").advice()
    assert shared[0].code == "cpu-saturated" and shared[0].severity == "info"
    path = write_run(tmp_path / "idle", breakdown=WAITING, stragglers=[2, 2, 2, 1, 2])
    write_records(path, cpu_samples(busy_percent=20.0))
    idle = kdt.Report.load(tmp_path / "idle").advice()
    assert "cpu-saturated" not in [item.code for item in idle]
    assert shared[1:] == idle  # the same findings, in the same order, word for word


def test_input_bound_run(tmp_path):
    write_run(tmp_path, breakdown=INPUT_BOUND)
    (advice,) = kdt.Report.load(tmp_path).advice()
    assert advice.title == "Input-bound: steps wait for data" and "25%" in advice.evidence
    assert "prefetch(tf.data.AUTOTUNE)" in advice.fix


def test_low_gpu_utilization_and_batching_findings(tmp_path):
    write_run(tmp_path, gpu_util=20.0, batching=[("error", "missing-multiply")])
    report = kdt.Report.load(tmp_path)
    assert report.steps["gpu_util_mean"].dropna().tolist() == pytest.approx([20.0] * 30)
    assert titles(report) == ["Batching: missing-multiply", "GPUs are idle much of the time"]


def test_scaling_comparison_and_advice(tmp_path):
    write_scaling_runs(tmp_path)
    report = kdt.Report.load(tmp_path)

    table = report.compare()
    assert table["replicas"].tolist() == [1, 4]
    assert table["speedup"].tolist() == pytest.approx([1.0, 2.0])
    assert table["scaling_efficiency"].tolist() == pytest.approx([1.0, 0.5])
    advice = report.advice()
    assert [item.title for item in advice][:2] == [
        "Communication-bound: gradients take a large share of each step",
        "Scaling is poor",
    ]
    assert advice[0].evidence.startswith("run four (4 replicas): ")
    assert "efficiency 50%" in advice[1].evidence
    summary = report.summary()
    assert summary.loc["four", "advice"].startswith("Communication-bound")


def test_exports_every_frame(tmp_path):
    write_run(tmp_path / "logs", breakdown=BALANCED, gpu_util=80.0)
    report = kdt.Report.load(tmp_path / "logs")

    csvs = report.to_csv(tmp_path / "csv")
    parquets = report.to_parquet(tmp_path / "parquet")

    names = {path.stem for path in csvs}
    assert names == {
        *("runs", "steps", "replicas", "windows", "gpu", "cpu", "batching", "summary"),
        *("workers", "restarts", "fits", "loops"),
    }
    steps = pd.read_parquet(next(p for p in parquets if p.stem == "steps"))
    assert len(steps) == 30 and steps["compute_ms"].notna().sum() == 5
    assert pd.read_csv(next(p for p in csvs if p.stem == "summary"))["replicas"].tolist() == [4]


def test_report_cli_prints_summary_and_advice_and_writes_html(tmp_path):
    write_run(tmp_path, breakdown=COMM_HEAVY)
    result = run_cli("report", str(tmp_path), "--html", str(tmp_path / "report.html"))

    assert result.returncode == 0, result.stderr
    assert "median_step_ms" in result.stdout and "Advice:" in result.stdout
    assert "[warning] Communication-bound" in result.stdout
    page = (tmp_path / "report.html").read_text()
    assert page.count("<img") == 4 and "Communication-bound" in page
    assert "<b>GPU utilization</b> left out" in page  # no GPU readings: one line instead


def test_report_cli_explains_a_folder_without_records(tmp_path):
    result = run_cli("report", str(tmp_path))
    assert result.returncode == 1 and "No keras_dp_tools records found" in result.stderr


def test_advice_reaches_tensorboard_after_fit(tmp_path, keras, strategy4):
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    callbacks = kdt.callbacks(tmp_path, global_batch=GLOBAL_BATCH, profile=False, monitor=False)
    assert type(callbacks[-1]).__name__ == "RunAdvisor"
    fit(dense_model(keras, strategy4), callbacks)

    multiplexer = EventMultiplexer(size_guidance={"tensors": 0})
    multiplexer.AddRunsFromDirectory(str(tmp_path))
    multiplexer.Reload()
    (text,) = multiplexer.GetAccumulator("keras_dp/worker-0").Tensors("keras_dp/advice")
    assert text.tensor_proto.string_val[0]  # findings, or "No findings: ..."
