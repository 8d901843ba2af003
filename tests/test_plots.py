"""Plots of recorded runs: each returns a Figure with labelled axes and the right data."""

import pytest
from matplotlib.figure import Figure

import keras_dp_tools as kdt
from keras_dp_tools import plots
from tests.recorded_runs import WAITING, write_run, write_scaling_runs


@pytest.fixture
def report(tmp_path):
    write_run(tmp_path, breakdown=WAITING, stragglers=[2, 2, 2, 1, 2], gpu_util=70.0)
    return kdt.Report.load(tmp_path)


def only_axes(figure):
    assert isinstance(figure, Figure)
    return figure.axes[0]


def test_step_breakdown_stacks_the_five_parts_to_the_step_time(report):
    axes = only_axes(plots.step_breakdown(report))
    assert len(axes.containers) == 5
    tops = [sum(bars[i].get_height() for bars in axes.containers) for i in range(5)]
    assert tops == pytest.approx([10.0] * 5)
    assert axes.get_ylabel().startswith("ms per step")
    assert axes.get_legend().get_texts()[0].get_text() == "compute"


def test_comm_share_plots_both_shares_in_percent(report):
    axes = only_axes(plots.comm_share(report))
    lines = axes.get_lines()
    # WAITING: 3 of 4 replicas wait 25% of the step; the straggler waits for nobody.
    assert len(lines) == 2 and list(lines[1].get_ydata()) == pytest.approx([18.75] * 5)


def test_sync_wait_shows_one_line_per_replica_and_means(report):
    left, right = plots.sync_wait(report).axes
    assert len(left.get_lines()) == 4
    means = [bar.get_height() for bar in right.patches]
    assert means[2] == pytest.approx(0.6)  # replica 2 was the straggler in 4 of 5 steps


def test_gpu_utilization_timeline_per_device(report):
    axes = only_axes(plots.gpu_utilization(report))
    assert len(axes.get_lines()) == 2 and axes.get_ylim()[1] == 105


def test_scaling_plot_has_ideal_and_measured(tmp_path):
    write_scaling_runs(tmp_path)
    axes = only_axes(plots.scaling(kdt.Report.load(tmp_path)))
    ideal, measured = axes.get_lines()
    assert list(measured.get_xdata()) == [1, 4]
    assert list(ideal.get_ydata()) == pytest.approx([6400.0, 25600.0])
    assert [text.get_text() for text in axes.texts] == ["100%", "50%"]


def test_plots_say_when_there_is_nothing_to_show(tmp_path):
    write_run(tmp_path, breakdown=None)
    report = kdt.Report.load(tmp_path)
    for plot in (plots.step_breakdown, plots.comm_share, plots.gpu_utilization):
        texts = [text.get_text() for axes in plot(report).axes for text in axes.texts]
        assert any(text.startswith("No ") for text in texts)
    assert only_axes(plots.scaling(report)).texts[0].get_text().startswith("Needs runs")


def test_unknown_run_is_named(report):
    with pytest.raises(ValueError, match="No run 'nope' in the report; it has r1"):
        plots.step_breakdown(report, run="nope")
