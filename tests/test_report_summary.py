"""Report.summary's step counts, and steps another profiler captured. No TensorFlow."""

from keras_dp_tools import Report
from keras_dp_tools.records.writer import RecordWriter, worker_records_path
from tests.helpers.recorded_runs import BALANCED, write_run


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
    assert summary["breakdown_steps"] == 5


def test_a_run_without_a_profiler_measures_every_step_after_warmup(tmp_path):
    write_run(tmp_path, steps=12, profiled=())

    summary = Report.load(tmp_path).summary(advice=False).iloc[0]

    assert (summary["steps"], summary["measured_steps"], summary["breakdown_steps"]) == (11, 11, 0)
