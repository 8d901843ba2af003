"""Plots of recorded runs: each returns a Figure with labelled axes and the right data, or
says in one line why there is nothing to draw. Every figure drawn here is also saved as
a PNG (``artifacts``) for a person to look at."""

import os
import shutil
import warnings

import pytest
from matplotlib.collections import PathCollection

import keras_dp_tools as kdt
from keras_dp_tools.report import plots
from keras_dp_tools.report.html import write_html
from keras_dp_tools.tools.cli import main
from tests.helpers.figures import (
    assert_each_line_stays_in_one_window,
    data_lines,
    only_axes,
    tick_labels,
)
from tests.helpers.pages import ReportPage
from tests.helpers.recorded_runs import (
    COMM_HEAVY,
    WAITING,
    write_run,
    write_scaling_runs,
    write_windowed_multiworker_run,
)

WINDOWS = ((10, 15), (110, 115), (210, 215))


@pytest.fixture
def report(tmp_path):
    write_run(tmp_path, breakdown=WAITING, stragglers=[2, 2, 2, 1, 2], gpu_util=70.0)
    return kdt.Report.load(tmp_path)


@pytest.fixture
def windowed(tmp_path):
    """Two workers of two replicas, each profiled in three windows; no GPU."""
    write_windowed_multiworker_run(tmp_path / "mw", windows=WINDOWS, breakdown=WAITING)
    return kdt.Report.load(tmp_path / "mw")


@pytest.fixture
def artifacts(tmp_path, request):
    """Saves figures as PNGs under the test's tmp dir, and copies them to
    $KERAS_DP_ARTIFACTS when set."""
    folder = tmp_path / "artifacts"
    folder.mkdir()

    def save(figure, name: str):
        path = folder / f"{request.node.name}-{name}.png"
        figure.savefig(path, dpi=100)
        if os.environ.get("KERAS_DP_ARTIFACTS"):
            target = os.path.join(os.environ["KERAS_DP_ARTIFACTS"], "plots")
            os.makedirs(target, exist_ok=True)
            shutil.copy(path, target)
        return path

    return save


def test_step_breakdown_stacks_the_five_parts_to_the_step_time(report, artifacts):
    figure = plots.step_breakdown(report)
    artifacts(figure, "breakdown")
    axes = only_axes(figure)
    assert len(axes.containers) == 5
    tops = [sum(bars[i].get_height() for bars in axes.containers) for i in range(5)]
    assert tops == pytest.approx([10.0] * 5)
    assert axes.get_ylabel().startswith("ms per step")
    assert axes.get_legend().get_texts()[0].get_text() == "compute"


def test_step_breakdown_puts_windows_and_workers_side_by_side(windowed, artifacts):
    figure = plots.step_breakdown(windowed)
    artifacts(figure, "breakdown")
    axes = only_axes(figure)
    assert len(axes.containers) == 5 * 2  # five parts for each of two workers
    compute_w0, compute_w1 = axes.containers[0], axes.containers[5]
    assert len(compute_w0) == len(compute_w1) == 15  # three windows of five steps
    # WAITING's exposed parts add up to its 10 ms step, for every bar of both workers.
    for worker in (0, 1):
        parts = axes.containers[5 * worker : 5 * worker + 5]
        tops = [sum(bars[i].get_height() for bars in parts) for i in range(15)]
        assert tops == pytest.approx([10.0] * 15)
    # Each worker's bar of a step sits on that step's tick, the two apart.
    labels = {int(label.get_text()): tick for tick, label in tick_labels(axes)}
    for bar_w0, bar_w1, step in zip(compute_w0, compute_w1, [10, 11, 12, 13, 14], strict=False):
        centres = [bar.get_x() + bar.get_width() / 2 for bar in (bar_w0, bar_w1)]
        assert centres[0] < labels[step] < centres[1]
    # An empty slot between windows: step 110 is not the slot after step 14.
    assert labels[110] - labels[14] == 2 and labels[210] - labels[114] == 2


def test_comm_share_draws_each_window_as_its_own_line(windowed, artifacts):
    figure = plots.comm_share(windowed)
    artifacts(figure, "comm_share")
    axes = only_axes(figure)
    lines = assert_each_line_stays_in_one_window(axes, WINDOWS)
    assert len(lines) == 2 * 2 * 3  # two shares, two workers, three windows
    wait_lines = [line for line in lines if line.get_marker() == "s"]
    # Worker w's waiting replica waits 2.5 ms * (1 + w) / 2 of each 10 ms step exposed,
    # the straggler none: the step's mean over the two replicas is 6.25% and 12.5%.
    shares = {line.get_label(): list(line.get_ydata()) for line in wait_lines}
    assert [y for line in wait_lines for y in line.get_ydata()] == pytest.approx(
        [6.25] * 15 + [12.5] * 15
    ), shares
    legend = [text.get_text() for text in axes.get_legend().get_texts()]
    assert legend == [
        "worker 0: comm share (transfer)",
        "worker 0: wait share",
        "worker 1: comm share (transfer)",
        "worker 1: wait share",
    ]


def test_comm_share_plots_both_shares_in_percent(report):
    lines = data_lines(only_axes(plots.comm_share(report)))
    # WAITING: 3 of 4 replicas wait 25% of the step; the straggler waits for nobody.
    assert len(lines) == 2 and list(lines[1].get_ydata()) == pytest.approx([18.75] * 5)


def test_sync_wait_shows_one_line_per_replica_and_means(report, artifacts):
    figure = plots.sync_wait(report)
    artifacts(figure, "sync_wait")
    left, right = figure.axes
    assert len(data_lines(left)) == 4
    means = [bar.get_height() for bar in right.patches]
    assert means[2] == pytest.approx(0.6)  # replica 2 was the straggler in 4 of 5 steps


def test_sync_wait_draws_each_replica_and_window_apart(windowed, artifacts):
    figure = plots.sync_wait(windowed)
    artifacts(figure, "sync_wait")
    left, right = figure.axes
    lines = assert_each_line_stays_in_one_window(left, WINDOWS)
    assert len(lines) == 2 * 2 * 3  # (worker, replica) pairs times windows
    names = [label.get_text() for label in right.get_xticklabels()]
    means = dict(zip(names, (bar.get_height() for bar in right.patches), strict=True))
    # Worker w's replica w % 2 is its straggler; its other replica waits 3 ms * (1 + w) / 2.
    assert means == pytest.approx({"w0 r0": 0.0, "w0 r1": 1.5, "w1 r0": 3.0, "w1 r1": 0.0})


def test_step_time_marks_warmup_and_profiled_steps(windowed, artifacts):
    figure = plots.step_time(windowed)
    artifacts(figure, "step_time")
    axes = only_axes(figure)
    # Shaded spans cover each window and the 3 steps of its analysis, nothing else.
    spans = sorted(
        (round(patch.get_x() + 0.5), round(patch.get_x() + patch.get_width() + 0.5))
        for patch in axes.patches
    )
    assert spans == [(10, 18), (110, 118), (210, 218)]
    # Warm-up step 0 (220 ms) is marked on its own.
    marked = [c for c in axes.collections if isinstance(c, PathCollection)]
    (warmup,) = [c for c in marked if c.get_label().startswith("warm-up")]
    assert list(warmup.get_offsets()[:, 0]) == [0, 0]  # one per worker
    # The y axis fits steady steps (10-12 ms), not the 220 ms warm-up nor the 30 ms
    # profiled steps, and says what lies above it.
    assert 12 < axes.get_ylim()[1] < 30
    assert "warm-up up to 220 ms" in axes.get_xlabel()
    assert "profiled up to 30 ms" in axes.get_xlabel()


def test_step_time_without_outliers_keeps_the_whole_range(tmp_path):
    write_run(tmp_path, step_ms=10.0)  # the warm-up record is also 10 ms
    axes = only_axes(plots.step_time(kdt.Report.load(tmp_path)))
    assert axes.get_ylim()[1] >= 10 and axes.get_xlabel() == "global step"


def test_gpu_utilization_timeline_per_device(report, artifacts):
    figure = plots.gpu_utilization(report)
    artifacts(figure, "gpu")
    axes = only_axes(figure)
    assert len(axes.get_lines()) == 2 and axes.get_ylim()[1] == 105


def test_gpu_utilization_is_left_out_with_the_reason_on_a_cpu_run(windowed):
    result = plots.gpu_utilization(windowed)
    assert isinstance(result, plots.Omitted)
    assert str(result) == (
        "GPU utilization: no GPU readings: the strategy uses no GPU (devices: /cpu:0, /cpu:1)"
    )
    assert "\n" not in str(result) and repr(result) == str(result)  # what a notebook shows
    with pytest.raises(ValueError, match="Nothing to save, the plot was left out"):
        result.savefig("gpu.png")


def test_scaling_plot_has_ideal_and_measured(tmp_path, artifacts):
    write_scaling_runs(tmp_path)
    figure = plots.scaling(kdt.Report.load(tmp_path))
    artifacts(figure, "scaling")
    axes = only_axes(figure)
    ideal, measured = axes.get_lines()
    assert list(measured.get_xdata()) == [1, 4]
    assert list(ideal.get_ydata()) == pytest.approx([6400.0, 25600.0])
    assert [text.get_text() for text in axes.texts] == ["100%", "50%"]


def test_plots_say_when_there_is_nothing_to_show(tmp_path):
    write_run(tmp_path, breakdown=None)
    report = kdt.Report.load(tmp_path)
    for plot in (plots.step_breakdown, plots.comm_share, plots.sync_wait, plots.gpu_utilization):
        result = plot(report)
        assert isinstance(result, plots.Omitted), plot.__name__
        assert result.reason.startswith("no "), result
    assert only_axes(plots.scaling(report)).texts[0].get_text().startswith("Needs runs")


def test_summary_table_of_one_run_is_field_label_unit_and_value(tmp_path):
    write_run(tmp_path, breakdown=COMM_HEAVY, step_ms=10.0, global_batch=64)
    table = plots.summary_table(kdt.Report.load(tmp_path))
    assert list(table.columns) == ["field", "label", "unit", "value"]
    rows = table.set_index("field")
    assert rows.loc["median_step_ms"].tolist() == ["Median step time", "ms", "10"]
    # 64 examples / 10 ms
    assert rows.loc["examples_per_s"].tolist() == ["Throughput", "examples/s", "6,400"]
    # 3.5 of the 10 ms profiled step is exposed transfer (4 exposed all-reduce, 0.5 wait).
    assert rows.loc["comm_share"].tolist() == ["Communication share", "%", "35.0"]
    assert rows.loc["wait_share", "value"] == "5.0"
    assert rows.loc["global_batch"].tolist() == ["Global batch", "examples", "64"]
    assert rows.loc["gpu_util"].tolist() == ["GPU utilization", "%", "not measured"]
    assert rows.loc["start"].tolist() == ["Start", "UTC", "1970-01-01 00:16:40"]  # Unix 1000 s


def test_summary_table_puts_runs_side_by_side(tmp_path):
    write_scaling_runs(tmp_path)
    table = plots.summary_table(kdt.Report.load(tmp_path)).set_index("field")
    assert list(table.columns) == ["label", "unit", "one", "four"]
    assert table.loc["replicas", ["one", "four"]].tolist() == ["1", "4"]
    assert table.loc["median_step_ms", ["one", "four"]].tolist() == ["10", "20"]


def test_html_report_shows_figures_and_says_what_it_left_out(windowed, tmp_path):
    page = write_html(windowed, tmp_path / "report.html").read_text()
    # Step time, breakdown, comm share, sync wait; the two workers' view and waits.
    assert page.count("<img") == 6
    assert "<b>GPU utilization</b> left out: no GPU readings: the strategy uses no GPU" in page
    shown = ReportPage(page)
    assert shown.summary["median_step_ms"]["label"] == "Median step time"
    assert shown.summary["median_step_ms"]["unit"] == "ms"
    assert shown.headings[:3] == ["h1 keras_dp_tools report", "h2 Summary", "h3 How to read it"]


def test_report_command_warns_nothing_of_ours(tmp_path, capsys):
    write_run(tmp_path / "run", breakdown=WAITING, stragglers=[2, 2, 2, 1, 2])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        warnings.filterwarnings("error", module=r"keras_dp_tools(\.|$)")
        code = main(["report", str(tmp_path / "run"), "--html", str(tmp_path / "r.html")])
    assert code == 0
    assert "HTML report:" in capsys.readouterr().out
