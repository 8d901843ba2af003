"""One container for a run's frames (``analysis.run_frames``): what ``Report`` wraps, its
parts for one run, and a user's edits through the Report. No TensorFlow."""

import pandas as pd

import keras_dp_tools as kdt
from keras_dp_tools.analysis.run_frames import FRAME_NAMES, RunFrames
from tests.helpers.recorded_runs import write_run

MULTI = {"workers": 2, "strategy": "CollectiveAllReduceStrategy", "cluster": "c0ffee"}


def test_one_runs_part_keeps_the_findings_about_its_own_job_only(tmp_path):
    # Job 1: its two workers recorded under two run ids (split). Job 2, an hour later:
    # one complete single-worker run.
    write_run(tmp_path, "w0-run", 0, steps=12, start=1000.0, header_fields=MULTI)
    write_run(tmp_path, "w1-run", 1, steps=12, start=1000.2, header_fields=MULTI)
    write_run(tmp_path / "later", "alone", 0, steps=12, start=4600.0)
    report = kdt.Report.load(tmp_path)

    assert [item.code for item in report.job_findings()] == ["split-runs"]
    for run in ("w0-run", "w1-run"):
        part = report.for_run(run)
        assert [item.code for item in part.job_findings()] == ["split-runs"], run
        assert set(part.runs["run"]) == {run}
    assert report.for_run("alone").job_findings() == []


def test_a_users_edits_of_the_reports_frames_are_what_the_analysis_reads(tmp_path):
    write_run(tmp_path, "r", 0, step_ms=10.0, steps=12)
    report = kdt.Report.load(tmp_path)
    assert isinstance(report.frames, RunFrames)
    assert report.summary(advice=False).loc["r", "median_step_ms"] == 10.0

    report.steps = report.steps.assign(step_ms=25.0)

    assert report.frames.steps is report.steps
    assert report.summary(advice=False).loc["r", "median_step_ms"] == 25.0
    report.gpu = pd.DataFrame(columns=report.gpu.columns)
    assert report.frames.gpu is report.gpu


def test_a_report_built_from_frames_has_every_frame_with_its_columns(tmp_path):
    path = write_run(tmp_path, "r", 0, steps=5)
    loaded = kdt.Report.from_files([(path, 0)])
    # Only the runs and steps given: the other frames are empty, with their columns.
    built = kdt.Report(loaded.runs, loaded.steps)

    for name in FRAME_NAMES:
        frame = getattr(built, name)
        assert list(frame.columns) == list(getattr(loaded, name).columns), name
    assert len(built.steps) == 5 and built.workers.empty
