"""The report of a real CPU run (the demo) as a person reads it: `keras-dp report --html`
prints no warning, the page has no line across unmeasured steps, no empty figure, a
summary that fits the page. PNGs of every figure and of the page (headless Chromium,
where installed) are kept under the test's tmp dir, and in $KERAS_DP_ARTIFACTS when set;
the page's top is docs/images/report.png (tests/helpers/screenshots.py)."""

import os
import shutil
import subprocess

import numpy as np
import pytest

import keras_dp_tools as kdt
from keras_dp_tools.report import plots
from tests.helpers.figures import assert_each_line_stays_in_one_window, only_axes
from tests.helpers.pages import ReportPage
from tests.helpers.processes import run_cli
from tests.helpers.screenshots import keep_screenshot, page_structure

pytestmark = pytest.mark.slow


def keep(path):
    if os.environ.get("KERAS_DP_ARTIFACTS"):
        target = os.path.join(os.environ["KERAS_DP_ARTIFACTS"], "report_page")
        os.makedirs(target, exist_ok=True)
        shutil.copy(path, target)
    return path


@pytest.fixture(scope="module")
def page(demo_run, tmp_path_factory):
    """`keras-dp report <demo> --html page.html`, run as a user runs it."""
    log_dir, _ = demo_run
    path = tmp_path_factory.mktemp("page") / "report.html"
    result = run_cli("report", str(log_dir), "--html", str(path))
    assert result.returncode == 0, result.stderr[-3000:]
    keep(path)
    return path, result


def test_report_command_prints_no_warning(page):
    _, result = page
    assert "Warning" not in result.stderr and "Warning" not in result.stdout, result.stderr
    assert "HTML report:" in result.stdout


def test_demo_plots_keep_windows_apart_and_leave_out_the_gpu(demo_run, tmp_path):
    log_dir, _ = demo_run
    report = kdt.Report.load(log_dir)
    windows = list(zip(report.windows["start_step"], report.windows["end_step"], strict=True))
    assert len(windows) == 3  # the demo profiles three windows
    figures = {
        plot.__name__: plot(report)
        for plot in (
            plots.step_time,
            plots.step_breakdown,
            plots.comm_share,
            plots.sync_wait,
            plots.gpu_utilization,
        )
    }
    for name, figure in figures.items():
        if not isinstance(figure, plots.Omitted):
            figure.savefig(tmp_path / f"demo-{name}.png", dpi=100)
            keep(tmp_path / f"demo-{name}.png")
    assert_each_line_stays_in_one_window(only_axes(figures["comm_share"]), windows)
    assert_each_line_stays_in_one_window(figures["sync_wait"].axes[0], windows)
    gpu = figures["gpu_utilization"]
    assert isinstance(gpu, plots.Omitted) and "uses no GPU" in gpu.reason
    table = plots.summary_table(report)
    assert list(table.columns) == ["field", "label", "unit", "value"]


def test_page_has_no_empty_figure_and_says_why(page):
    path, _ = page
    html = path.read_text()
    assert html.count("<img") == 4  # step time, breakdown, comm share, sync wait
    assert "<b>GPU utilization</b> left out: no GPU readings: the strategy uses no GPU" in html
    shown = ReportPage(html)
    assert shown.summary["comm_share"]["label"] == "Communication share"
    assert shown.summary["gpu_util"]["values"] == ["not measured"]  # CPU replicas
    assert "How to read it" in shown.headings[2] and len(shown.reading) <= 6


def chromium() -> str | None:
    return next(
        (shutil.which(name) for name in ("chromium", "chromium-browser") if shutil.which(name)),
        None,
    )


@pytest.mark.skipif(chromium() is None, reason="needs chromium (apt-get install chromium)")
def test_page_fits_its_column_in_a_browser(page, tmp_path):
    from PIL import Image

    path, _ = page
    shot = tmp_path / "report.png"
    subprocess.run(
        [
            chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--window-size=1400,4000",
            f"--screenshot={shot}",
            path.as_uri(),
        ],
        capture_output=True,
        timeout=120,
        check=True,
    )
    keep(shot)
    pixels = np.asarray(Image.open(shot).convert("L"))
    assert (pixels < 250).sum() > 10_000  # something was drawn
    # The page is a 1100 px column centred in 1400 px: nothing (a wide table, say)
    # may reach into the 100 px margins.
    assert (pixels[:, -100:] < 250).sum() == 0
    assert (pixels[:, :100] < 250).sum() == 0
    shown = ReportPage(path.read_text())
    keep_screenshot("report", shot, page_structure(shown, shown.headings))
