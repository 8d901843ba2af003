"""The worker view of a multi-worker run in the plots and the HTML report, on runs
written by ``tests.helpers.cluster_records`` (worker ``LATE`` enters every step
``LATE_MS`` late; all workers leave the all-reduce together): the step-time plot draws
the job's step times, checked against worker 0's step ends in its records file; the
worker view and the heat map show the late worker, checked against the injected delay."""

import io
import json
import warnings

import numpy as np
import pytest

import keras_dp_tools as kdt
from keras_dp_tools.records.writer import worker_records_path
from keras_dp_tools.report import plots, worker_plots
from keras_dp_tools.report.html import write_html
from tests.helpers.cluster_records import write_cluster_run
from tests.helpers.pages import ReportPage

WORKERS, STEPS, LATE, LATE_MS = 8, 300, 3, 3.0
SPREAD_MS = 0.4  # the generator's spread of the workers' entries into a step
JOB_LINE = "the job (shared step end to the next)"


def write(path, **given):
    settings = dict(
        workers=WORKERS,
        steps=STEPS,
        replicas_per_worker=2,
        windows=((100, 105),),
        straggler=LATE,
        straggler_ms=LATE_MS,
    )
    write_cluster_run(path, **{**settings, **given})
    return path


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    path = write(tmp_path_factory.mktemp("job"))
    return path, kdt.Report.load(path)


def recorded_step_ends(log_dir, worker: int) -> dict[int, float]:
    """Step -> when the worker's train call returned, in s on its own clock, read from
    its records file as written (entry ``time`` plus ``step_ms`` per step)."""
    ends = {}
    for line in worker_records_path(log_dir, worker).read_text().splitlines():
        record = json.loads(line)
        if record["type"] == "step":
            ends[record["step"]] = record["time"] + record["step_ms"] * record["steps"] / 1e3
    return ends


def test_the_step_time_plot_draws_the_jobs_step_times(job):
    log_dir, report = job
    figure = plots.step_time(report)
    axes = figure.axes[0]

    (line,) = [line for line in axes.get_lines() if line.get_label() == JOB_LINE]
    steps, shown = line.get_xdata(), line.get_ydata()
    # From one step end to the next on worker 0's clock: all workers leave together.
    ends = recorded_step_ends(log_dir, 0)
    expected = [(ends[step] - ends[step - 1]) * 1e3 for step in steps]
    assert shown == pytest.approx(expected, abs=1e-3)  # 1 us: doubles of epoch seconds
    assert len(steps) >= STEPS - 3  # every step but the warm-up and the one after it
    # The workers' own times in the train call: a band under the job's line, its floor
    # the late worker's (it waits least).
    (band,) = [item for item in axes.collections if "own time" in item.get_label()]
    assert "shortest to longest" in band.get_label()
    own = report.steps.pivot(index="step", columns="worker", values="step_ms")
    assert own.loc[steps].idxmin(axis=1).eq(LATE).mean() > 0.95
    assert f"Worker {LATE} enters most steps last" in figure.get_suptitle()
    assert "its own step times are the shortest" in figure.get_suptitle()


def test_a_few_workers_get_a_line_each_beside_the_job(tmp_path):
    report = kdt.Report.load(write(tmp_path, workers=2, straggler=1, steps=60))
    axes = plots.step_time(report).axes[0]

    labels = [line.get_label() for line in axes.get_lines()]
    assert labels == [
        "worker 0 (its own time in the train call)",
        "worker 1 (its own time in the train call)",
        JOB_LINE,
    ]


def test_a_run_of_one_worker_keeps_its_step_times(tmp_path):
    report = kdt.Report.load(write(tmp_path, workers=1, straggler=-1, steps=60))
    figure = plots.step_time(report)

    assert [line.get_label() for line in figure.axes[0].get_lines()] == ["every step"]
    assert figure.get_suptitle() == ""
    assert isinstance(worker_plots.worker_view(report), plots.Omitted)
    assert isinstance(worker_plots.worker_wait_map(report), plots.Omitted)


def test_the_worker_view_shows_who_keeps_the_job_waiting(job):
    _, report = job
    figure = worker_plots.worker_view(report)
    waits, shares = figure.axes

    last = {round(bar.get_x() + bar.get_width() / 2): bar for bar in shares.patches}
    assert sorted(last) == list(range(WORKERS))
    assert last[LATE].get_height() == pytest.approx(100.0)
    assert all(last[worker].get_height() == 0 for worker in last if worker != LATE)
    wait = {round(bar.get_x() + bar.get_width() / 2): bar.get_height() for bar in waits.patches}
    assert wait[LATE] == 0
    for worker, height in wait.items():
        if worker != LATE:  # the injected delay, give or take the entries' spread
            assert height == pytest.approx(LATE_MS, abs=SPREAD_MS / 2)
    assert last[LATE].get_facecolor() != last[0].get_facecolor()
    assert f"worker {LATE} entered 100% of the steps last" in figure.get_suptitle()


@pytest.mark.parametrize("columns", [None, 50])
def test_the_heat_map_has_the_late_workers_row_dark(job, monkeypatch, columns):
    _, report = job
    if columns:
        monkeypatch.setattr(worker_plots, "MAP_COLUMNS", columns)
    figure = worker_plots.worker_wait_map(report)
    axes = figure.axes[0]

    cells = np.asarray(axes.images[0].get_array())
    assert cells.shape == (WORKERS, columns or STEPS - 1)  # steps after the warm-up
    assert np.all(cells[LATE] == 0)
    others = np.delete(cells, LATE, axis=0)
    assert others.min() >= LATE_MS - SPREAD_MS and others.max() <= LATE_MS + SPREAD_MS
    assert ("bins" in axes.get_xlabel()) == bool(columns)


def test_the_html_report_has_a_worker_view(job, tmp_path):
    _, report = job
    page = ReportPage(write_html(report, tmp_path / "report.html").read_text())

    assert "h3 Workers" in page.headings
    table = page.tables["workers-0"]
    assert table[0][:3] == ["worker", "median_worker_wait_ms", "last_to_enter_share"]
    assert table[1][0] == str(LATE)  # ranked: the late worker first
    assert len(table) == 1 + WORKERS  # 8 workers: every row


def test_the_html_report_of_many_workers_shows_the_top_few_and_a_heat_map(tmp_path):
    report = kdt.Report.load(write(tmp_path, workers=12, steps=120, windows=()))
    html = write_html(report, tmp_path / "report.html").read_text()
    page = ReportPage(html)

    table = page.tables["workers-0"]
    assert len(table) == 1 + 5 and table[1][0] == str(LATE)
    assert "7 more workers of run" in html
    assert "Wait for the last worker to enter, per step" in html
    assert html.count("<img") == 3  # step time, the worker view, the heat map


def test_plots_of_many_workers_say_how_many_lines_instead_of_a_legend(tmp_path):
    report = kdt.Report.load(write(tmp_path, workers=20, steps=120, windows=((50, 55),)))

    for plot, what in ((plots.comm_share, "40 lines"), (plots.sync_wait, "40 replicas")):
        figure = plot(report)
        axes = figure.axes[0]
        assert axes.get_legend() is None
        assert f"{what}" in axes.get_xlabel() and "too many to list" in axes.get_xlabel()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a legend of 40 entries collapsed the layout
            figure.savefig(io.BytesIO(), format="png", dpi=50)


def test_the_sync_wait_plot_of_workers_says_their_wait_for_each_other_is_elsewhere(job, tmp_path):
    _, report = job
    assert "wait for another worker is not in these lines" in plots.sync_wait(report).get_suptitle()

    one = kdt.Report.load(write(tmp_path, workers=1, straggler=-1, steps=60, windows=((20, 25),)))
    assert plots.sync_wait(one).get_suptitle() == ""
