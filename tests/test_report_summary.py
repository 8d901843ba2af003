"""Report.summary's step counts, steps another profiler captured, and the labelled
summary every view shows. No TensorFlow."""

import pytest

from keras_dp_tools import Report
from keras_dp_tools.records.writer import RecordWriter, worker_records_path
from keras_dp_tools.report import summary_fields
from keras_dp_tools.report.html import write_html
from keras_dp_tools.report.tensorboard_plugin.data import LogDirData
from tests.helpers.pages import ReportPage, assert_shows, dashboard_summary, text_summary
from tests.helpers.recorded_runs import BALANCED, COMM_HEAVY, write_run


def test_summary_counts_the_steps_behind_each_statistic(tmp_path):
    # 30 steps: 0 is warm-up, 10-14 our analysed window, 20-22 TensorBoard's capture.
    write_run(tmp_path, steps=30, profiled=range(10, 15), breakdown=BALANCED)
    writer = RecordWriter(worker_records_path(tmp_path, 0))
    writer.write(
        {
            "type": "window",
            "run": "r1",
            "worker": 0,
            "time": 1000.2,
            "start_step": 20,
            "end_step": 23,
            "status": "foreign",
            "reason": "profiled by keras.callbacks.TensorBoard(profile_batch=(21, 23))",
        }
    )
    writer.close()

    report = Report.load(tmp_path)
    summary = report.summary(advice=False).iloc[0]

    profiled = report.steps.loc[report.steps["profiled"], "step"].tolist()
    assert profiled == [10, 11, 12, 13, 14, 20, 21, 22]
    assert summary["steps"] == 29
    assert summary["measured_steps"] == 29 - 8
    # 8 left out: 5 in our window, 3 in TensorBoard's capture (its profiled steps).
    assert summary["left_out_steps"] == len(profiled) == 8
    assert summary["breakdown_steps"] == 5


def test_a_run_without_a_profiler_measures_every_step_after_warmup(tmp_path):
    write_run(tmp_path, steps=12, profiled=())

    summary = Report.load(tmp_path).summary(advice=False).iloc[0]

    assert (summary["steps"], summary["measured_steps"], summary["breakdown_steps"]) == (11, 11, 0)
    assert summary["left_out_steps"] == 0


def test_text_html_and_dashboard_show_the_same_labelled_summary(tmp_path):
    # 10 ms steps of 64 examples; each profiled step: 3.5 ms exposed transfer, 0.5 ms wait.
    write_run(tmp_path, breakdown=COMM_HEAVY, step_ms=10.0, global_batch=64)
    report = Report.load(tmp_path)
    numbers = report.summary(advice=False).loc["r1"]

    text = text_summary(report.text())
    page = ReportPage(write_html(report, tmp_path / "report.html").read_text())
    dashboard = LogDirData(tmp_path).run("r1", None)
    dashboard_rows = dashboard_summary(dashboard)

    assert list(text) == list(numbers.index)  # every field, in the summary's order
    assert page.summary == text and dashboard_rows == text
    for field, row in text.items():
        assert_shows(field, row["values"][0], numbers[field])
    # Worked out by hand from the records: shares in %, units apart, NaN said in words.
    assert text["comm_share"] == {"label": "Communication share", "values": ["35.0"], "unit": "%"}
    assert text["wait_share"]["values"] == ["5.0"]
    assert text["median_step_ms"] == {"label": "Median step time", "values": ["10"], "unit": "ms"}
    assert text["examples_per_s"]["values"] == ["6,400"]
    assert text["gpu_util"]["values"] == ["not measured"]
    # The dashboard's JSON keeps the number for machines: the fraction, not the percent.
    values = {entry["field"]: entry["value"] for entry in dashboard["summary"]}
    assert values["comm_share"] == pytest.approx(0.35) and values["gpu_util"] is None
    # How to read it, the same lines under each summary.
    assert page.reading == dashboard["reading"]["lines"]
    assert "\n".join(f"- {line}" for line in page.reading) in report.text()
    note = " ".join(page.reading)
    assert "do not add up to the step time" in note and "keras-dp docs reading" in note
    assert "exposed all-reduce transfer only" in note


def test_several_runs_are_columns_of_the_text_summary(tmp_path):
    write_run(tmp_path / "a", run="a", replicas=2, step_ms=10.0)
    write_run(tmp_path / "b", run="b", replicas=4, step_ms=12.0, start=2000.0)

    text = Report.load(tmp_path).text()

    assert text.startswith("Summary of runs a, b:")
    rows = text_summary(text)
    assert rows["replicas"]["values"] == ["2", "4"]
    assert rows["median_step_ms"] == {"label": "Median step time", "values": ["10", "12"],
                                      "unit": "ms"}  # fmt: skip


@pytest.mark.parametrize(
    ("share", "shown"),
    [(0.0004, "<0.1"), (0.0, "0.0"), (0.0006, "0.1"), (0.072, "7.2"), (1.0, "100.0")],
)
def test_a_tiny_share_is_not_shown_as_zero(share, shown):
    # 0.04 % rounds to 0.0 at one decimal, which reads as "none"; 0.06 % rounds up.
    assert summary_fields.percent_text(share) == shown


@pytest.mark.parametrize(
    ("value", "shown"),
    [(1e-5, "<0.001"), (0.0, "0"), (0.001, "0.001"), (0.0123, "0.0123"), (12345.2, "12,345")],
)
def test_a_tiny_number_is_not_written_in_exponent_notation(value, shown):
    assert summary_fields.number_text(value) == shown


def test_a_multi_worker_runs_step_counts_add_up_on_the_page(tmp_path):
    from tests.helpers.recorded_runs import write_windowed_multiworker_run

    # 240 steps (0 is warm-up), windows 10-14, 110-114, 210-214, each followed by 3 steps
    # of background analysis.
    write_windowed_multiworker_run(tmp_path)
    summary = Report.load(tmp_path).summary(advice=False).iloc[0]

    assert summary["steps"] == 239
    # Left out, by hand: per window its 5 steps, the 3 of the analysis and the step after
    # (a job step runs from the previous call's end), and step 1 (no step end before it).
    assert summary["left_out_steps"] == 3 * (5 + 3 + 1) + 1
