"""The advisor is a pure function of DataFrames: plain frames (no Report) give the
report's advice, and the frames come back unchanged."""

import pandas as pd

from keras_dp_tools.analysis.advice import advise
from keras_dp_tools.analysis.run_frames import FRAME_NAMES, RunFrames
from keras_dp_tools.report.facade import Report
from tests.helpers.recorded_runs import COMM_HEAVY, write_run, write_scaling_runs


def plain_frames(report: Report) -> RunFrames:
    return RunFrames(**{name: getattr(report, name).copy() for name in FRAME_NAMES})


def test_plain_frames_give_the_reports_advice_and_stay_unchanged(tmp_path):
    write_run(tmp_path, breakdown=COMM_HEAVY, gpu_util=20.0, batching=[("warning", "x")])
    report = Report.load(tmp_path)
    frames = plain_frames(report)
    before = plain_frames(report)
    advice = advise(frames)
    titles = [item.title for item in advice]
    assert any("ommunication" in title for title in titles)  # 35% of the step: over 20%
    assert any("idle" in title for title in titles)  # 20% GPU utilization: under 50%
    assert advice == report.advice()
    for name in FRAME_NAMES:
        pd.testing.assert_frame_equal(getattr(frames, name), getattr(before, name))


def test_the_scaling_finding_comes_from_the_table_given(tmp_path):
    write_scaling_runs(tmp_path)  # 50% scaling efficiency at 4 replicas
    report = Report.load(tmp_path)
    frames = plain_frames(report)
    assert "Scaling is poor" not in [item.title for item in advise(frames)]
    with_table = advise(frames, scaling=report.compare())
    assert "Scaling is poor" in [item.title for item in with_table]
    assert with_table == report.advice()
