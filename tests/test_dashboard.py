"""The "Data parallel" TensorBoard dashboard: its data layer, and the page rendered by a
real `tensorboard` in headless Chromium (skipped, saying why, where Chromium is missing)."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

import keras_dp_tools as kdt
from keras_dp_tools.report.tensorboard_plugin import data as dashboard
from tests.helpers.processes import get_json
from tests.helpers.recorded_runs import write_run

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


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

    summary = {row["metric"]: row["value"] for row in answer["summary"]}
    assert summary["steps"] == 99_999  # the warm-up call is not counted
    assert summary["median_step_ms"] == pytest.approx(13.0)  # 10 + median of step % 7
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


def browser() -> str | None:
    return next(filter(None, map(shutil.which, BROWSERS)), None)


class DashboardPage(HTMLParser):
    """What the test reads from the rendered page: texts by element id, the summary
    table's values by metric, and the SVG charts."""

    def __init__(self):
        super().__init__()
        self.texts: dict[str, str] = {}
        self.summary: dict[str, str] = {}
        self.svgs = 0
        self.figures = 0
        self._open: list[tuple[str, str | None]] = []
        self._metric = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "svg":
            self.svgs += 1
        if "figure" in (attrs.get("class") or "").split():
            self.figures += 1
        if tag == "tr" and "data-metric" in attrs:
            self._metric = attrs["data-metric"]
        collect = attrs.get("id")
        if tag == "td" and "value" in (attrs.get("class") or "") and self._metric:
            collect = f"summary:{self._metric}"
        self._open.append((tag, collect))

    def handle_endtag(self, tag):
        while self._open:
            opened, _ = self._open.pop()
            if opened == tag:
                break
        if tag == "tr":
            self._metric = None

    def handle_data(self, text):
        for _, collect in self._open:
            if collect:
                self.texts[collect] = self.texts.get(collect, "") + text


def headless(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """Chromium without a display, sandbox (CI runs as root) or any host but loopback:
    the page must render from what TensorBoard serves."""
    profile = Path(os.environ.get("TMPDIR", "/tmp")) / f"kdp-chromium-{os.getpid()}"
    command = [
        browser(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        "--virtual-time-budget=60000",
        *args,
    ]
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    finally:
        shutil.rmtree(profile, ignore_errors=True)


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
    page = DashboardPage()
    page.feed(dumped.stdout)
    screenshot = tmp_path / "dashboard.png"
    shot = headless("--window-size=1280,5200", f"--screenshot={screenshot}", page_url)
    if os.environ.get("KERAS_DP_SCREENSHOT_DIR"):
        shutil.copy(screenshot, Path(os.environ["KERAS_DP_SCREENSHOT_DIR"]) / screenshot.name)

    report = kdt.Report.load(log_dir)
    (run,) = report.runs["run"].unique()
    assert page.texts.get("run-id") == run, dumped.stdout[-3000:] + dumped.stderr[-2000:]
    summary = report.summary().loc[run]
    shown = {key.split(":", 1)[1]: text for key, text in page.texts.items() if ":" in key}
    numbers = [name for name, value in summary.items() if isinstance(value, (int, float))]
    assert {"median_step_ms", "comm_share", "wait_share"} <= set(numbers)
    for name in numbers:
        value = float(summary[name])
        if math.isnan(value):
            assert shown[name] == "–", name
        else:
            assert float(shown[name]) == pytest.approx(value, rel=1e-3), name
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
