"""The "Data parallel" TensorBoard dashboard: its data layer, and the page rendered by a
real `tensorboard` in headless Chromium (skipped, saying why, where Chromium is missing),
which shows the same labelled summary as the HTML report and ``Report.text()``; its top
is docs/images/dashboard.png (tests/helpers/screenshots.py). A log dir that holds only a
strategy comparison renders its section."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import keras_dp_tools as kdt
from keras_dp_tools.report.html import write_html
from keras_dp_tools.report.tensorboard_plugin import data as dashboard
from tests.helpers.browser import browser, headless
from tests.helpers.comparisons import CODE, assert_known_table, write_known_comparison
from tests.helpers.pages import ReportPage, assert_shows, dashboard_summary, text_summary
from tests.helpers.processes import get_json, tensorboard_server
from tests.helpers.recorded_runs import write_run
from tests.helpers.screenshots import keep_screenshot, page_structure


def write_dashboard_run(
    log_dir: Path,
    steps: int,
    step_ms=lambda step: 10.0 + step % 7,
    run: str = "big",
    replicas: int = 2,
    start: float = 1.7e9,
) -> Path:
    """One worker's header (no global batch) and ``steps`` step records, 10 ms apart."""
    return write_run(
        log_dir,
        run,
        step_ms=step_ms,
        steps=steps,
        replicas=replicas,
        global_batch=None,
        start=start,
        step_seconds=0.01,
    )


def test_thinning_averages_equal_buckets():
    import pandas as pd

    frame = pd.DataFrame({"worker": 0, "step": range(10_000), "step_ms": range(10_000)})
    thinned, per_point = dashboard.thin(frame, ["worker"], "step", limit=2000)
    assert per_point == 5 and len(thinned) == 2000
    # Bucket k holds steps 5k..5k+4: its mean is 5k + 2, and it is placed at step 5k.
    assert thinned["step_ms"].iloc[:3].tolist() == [2.0, 7.0, 12.0]
    assert thinned["step"].iloc[:3].tolist() == [0, 5, 10]
    untouched, one = dashboard.thin(frame.head(100), ["worker"], "step", limit=2000)
    assert one == 1 and len(untouched) == 100


def test_large_run_stays_a_small_page(tmp_path):
    write_dashboard_run(tmp_path, 100_000)
    data = dashboard.LogDirData(tmp_path)

    answer = data.run("big", None)
    svg = data.figure("step_time", "big", None, None)

    summary = {row["field"]: row["value"] for row in answer["summary"]}
    shown = {row["field"]: row["shown"] for row in answer["summary"]}
    assert summary["steps"] == 99_999 and shown["steps"] == "99,999"  # warm-up not counted
    assert summary["median_step_ms"] == pytest.approx(13.0)  # 10 + median of step % 7
    assert shown["median_step_ms"] == "13"
    assert "mean of 50 consecutive rows" in svg
    assert len(svg) < 400_000  # 2,000 points, not 100,000
    json.dumps(answer)  # the route's answer is plain JSON


def test_a_log_dir_being_written_is_reread(tmp_path, monkeypatch):
    monkeypatch.setattr(dashboard, "MIN_RELOAD_SECONDS", 0.0)
    data = dashboard.LogDirData(tmp_path)
    assert data.runs()["runs"] == [] and not data.has_records()

    path = write_dashboard_run(tmp_path, 20)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:11]) + lines[11][:15])  # a writer mid-line
    assert data.run("big", None)["steps_recorded"] == 10

    path.write_bytes(b"".join(lines))
    assert data.run("big", None)["steps_recorded"] == 20
    assert [run["run"] for run in data.runs()["runs"]] == ["big"]


def test_a_sweep_gets_the_scaling_table(tmp_path):
    write_dashboard_run(tmp_path / "r1", 30, lambda step: 10.0, run="one", replicas=1)
    write_dashboard_run(tmp_path / "r2", 30, lambda step: 16.0, run="two", replicas=2, start=1.8e9)
    data = dashboard.LogDirData(tmp_path)

    answer = data.runs()

    assert [run["run"] for run in answer["runs"]] == ["two", "one"]  # newest first
    columns = zip(*answer["scaling"]["rows"], strict=True)
    scaling = dict(zip(answer["scaling"]["columns"], columns, strict=True))
    # Without a global batch, throughput is steps/s: 100 at 1 replica, 62.5 at 2.
    assert scaling["throughput"] == pytest.approx((100.0, 62.5))
    assert scaling["scaling_efficiency"] == pytest.approx((1.0, 0.3125))
    assert data.figure("scaling", None, None, None).startswith("<svg")


def test_unknown_run_says_what_exists(tmp_path):
    write_dashboard_run(tmp_path, 5)
    with pytest.raises(LookupError, match="it has big"):
        dashboard.LogDirData(tmp_path).run("nope", None)


# -- in a real browser ----------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(
    browser() is None,
    reason="needs Chromium for the browser test (apt-get install chromium; .ci/run does)",
)
def test_dashboard_renders_in_chromium(demo_tensorboard, tmp_path):
    base, log_dir = demo_tensorboard
    listing = get_json(f"{base}/data/plugins_listing")
    assert listing["data_parallel"]["enabled"], listing.get("data_parallel")
    assert listing["data_parallel"]["tab_name"] == "Data parallel"
    # TensorBoard's own iframe document for the plugin: the page as users see it in the tab.
    page_url = f"{base}/data/plugin_entry.html?name=data_parallel"

    dumped = headless("--window-size=1280,16000", "--dump-dom", page_url)
    page = ReportPage(dumped.stdout)
    screenshot = tmp_path / "dashboard.png"
    shot = headless("--window-size=1280,1600", f"--screenshot={screenshot}", page_url)
    if os.environ.get("KERAS_DP_SCREENSHOT_DIR"):
        shutil.copy(screenshot, Path(os.environ["KERAS_DP_SCREENSHOT_DIR"]) / screenshot.name)

    report = kdt.Report.load(log_dir)
    (run,) = report.runs["run"].unique()
    assert page.texts.get("run-id") == run, dumped.stdout[-3000:] + dumped.stderr[-2000:]
    # One labelled summary everywhere: the page, its data (LogDirData.run), the HTML
    # report and Report.text() show the same label, value and unit for every field of
    # Report.summary(), and each value says what the number says (a share in %).
    numbers = report.summary(advice=False).loc[run]
    answer = dashboard.LogDirData(log_dir).run(run, None)
    data = dashboard_summary(answer)
    html_page = ReportPage(write_html(report, tmp_path / "report.html").read_text())
    assert list(page.summary) == list(numbers.index)
    assert page.summary == data == html_page.summary == text_summary(report.text())
    for field, row in page.summary.items():
        assert_shows(field, row["values"][0], numbers[field])
    raw = {entry["field"]: entry["value"] for entry in answer["summary"]}
    assert raw["comm_share"] == pytest.approx(numbers["comm_share"])  # the fraction
    assert page.summary["comm_share"]["label"] == "Communication share"
    assert page.summary["comm_share"]["unit"] == "%"
    assert page.summary["gpu_util"]["values"] == ["not measured"]  # CPU replicas
    assert page.reading == answer["reading"]["lines"] == html_page.reading
    assert "fractions" not in page.texts.get("main", "")
    # The advice, each finding with its evidence and fix, as the advisor words it.
    advice = report.for_run(run).advice()
    text = page.texts.get("advice", "")
    if advice:
        for item in advice:
            assert item.title in text and item.fix in text
    else:
        assert "nothing stands out" in text
    # Charts: step time, a breakdown per window (the demo profiles 3), comm share and
    # sync wait, every one an SVG from the server (none left loading); on CPU replicas
    # a line says why GPU utilization is absent.
    analysed = (report.windows["status"] == "analysed").sum()
    assert analysed == 3
    assert page.figures == 3 + analysed
    assert page.svgs >= page.figures
    assert "Loading chart" not in dumped.stdout
    assert "No GPU readings for this run" in page.texts.get("gpu-note", "")
    assert shot.returncode == 0 and screenshot.stat().st_size > 10_000, shot.stderr[-2000:]
    # The run's id is in its heading; section headings (h2) and the summary's labels
    # are the page's structure. The windows' headings (h3) hold step numbers: left out.
    headings = [h for h in page.headings if h.startswith(("h1 ", "h2 ")) and run not in h]
    keep_screenshot("dashboard", screenshot, page_structure(page, headings))


@pytest.mark.slow
@pytest.mark.skipif(
    browser() is None,
    reason="needs Chromium for the browser test (apt-get install chromium; .ci/run does)",
)
def test_a_strategy_comparison_alone_renders_in_chromium(tmp_path):
    log_dir = tmp_path / "logs"
    write_known_comparison(log_dir)  # no training records at all

    with tensorboard_server(log_dir, ready=lambda base: True) as base:
        page_url = f"{base}/data/plugin_entry.html?name=data_parallel"
        dumped = headless("--window-size=1280,4000", "--dump-dom", page_url)
    page = ReportPage(dumped.stdout)

    assert "h2 Strategy comparison" in page.headings, dumped.stdout[-3000:]
    verdict = page.texts["comparison-0-verdict"]
    assert verdict.startswith("mirrored: 3.70x one_device (45678 examples/s)")
    assert_known_table(page.tables["comparison-0-table"])
    assert page.texts["comparison-0-code"] == " ".join(CODE.split())
    assert page.svgs >= 1 and "Loading chart" not in dumped.stdout  # the chart, as SVG
    assert "Examples per second by strategy" in dumped.stdout
    assert "besides the strategy comparison" in page.texts["no-runs"]
