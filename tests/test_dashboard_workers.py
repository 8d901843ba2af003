"""The worker view of the "Data parallel" tab for a multi-worker run written by
``tests.helpers.cluster_records`` (worker ``LATE`` enters every step ``LATE_MS`` late):
its data (``LogDirData.run``'s ``workers_view`` and the worker figures) and the page
rendered by a real ``tensorboard`` in headless Chromium."""

from __future__ import annotations

import pytest

from keras_dp_tools.report.tensorboard_plugin import data as dashboard
from tests.helpers.browser import browser, headless
from tests.helpers.cluster_records import write_cluster_run
from tests.helpers.pages import ReportPage
from tests.helpers.processes import tensorboard_server

LATE, LATE_MS = 3, 3.0


def write(log_dir, workers: int):
    write_cluster_run(
        log_dir,
        workers=workers,
        steps=120,
        replicas_per_worker=2,
        windows=((50, 55),),
        straggler=LATE,
        straggler_ms=LATE_MS,
    )
    return log_dir


def test_the_run_answer_has_the_ranked_workers_and_their_figures(tmp_path):
    data = dashboard.LogDirData(write(tmp_path, workers=12))
    (run,) = [entry["run"] for entry in data.runs()["runs"]]

    view = data.run(run, None)["workers_view"]

    columns, rows = view["table"]["columns"], view["table"]["rows"]
    assert columns[:3] == ["worker", "median_worker_wait_ms", "last_to_enter_share"]
    assert rows[0][0] == LATE and len(rows) == 5  # ranked: the late worker first
    assert rows[0][2] == 1.0  # last in every step
    # The others waited the injected delay, give or take the entries' 0.4 ms spread.
    assert all(abs(row[1] - LATE_MS) <= 0.2 for row in rows[1:])
    assert view["rest"][0].startswith("... 7 more workers of run")
    assert view["figures"] == ["worker_view", "worker_wait_map"]
    shown = data.figure("worker_view", run, None, None)
    assert shown.startswith("<svg") and f"worker {LATE} entered 100% of the steps last" in shown
    assert data.figure("worker_wait_map", run, None, None).startswith("<svg")
    # One worker picked: no cross-worker view.
    assert data.run(run, 0)["workers_view"] is None
    with pytest.raises(LookupError, match="one worker"):
        data.figure("worker_view", run, 0, None)


def test_a_few_workers_get_the_wait_lines(tmp_path):
    data = dashboard.LogDirData(write(tmp_path, workers=4))
    (run,) = [entry["run"] for entry in data.runs()["runs"]]

    view = data.run(run, None)["workers_view"]

    assert len(view["table"]["rows"]) == 4 and view["rest"] == []
    assert view["figures"] == ["worker_view", "worker_wait"]
    assert data.figure("worker_wait", run, None, None).startswith("<svg")


@pytest.mark.slow
@pytest.mark.skipif(
    browser() is None,
    reason="needs Chromium for the browser test (apt-get install chromium; .ci/run does)",
)
def test_the_tab_shows_the_worker_view_in_chromium(tmp_path):
    log_dir = write(tmp_path / "logs", workers=4)

    with tensorboard_server(log_dir, ready=lambda base: True) as base:
        page_url = f"{base}/data/plugin_entry.html?name=data_parallel"
        dumped = headless("--window-size=1280,16000", "--dump-dom", page_url)
    page = ReportPage(dumped.stdout)

    assert "h2 Workers" in page.headings, dumped.stdout[-3000:] + dumped.stderr[-2000:]
    table = page.tables["workers-table"]
    assert table[1][0] == str(LATE)  # ranked: the worker the others wait for
    assert "Loading chart" not in dumped.stdout
    assert f"worker {LATE} entered 100% of the steps last" in dumped.stdout
    # Step time, comm share, sync wait, the window's breakdown on each of the 4 workers;
    # the worker view and the wait lines: each an SVG from the server.
    assert page.figures == 3 + 4 + 2 and page.svgs >= 9
    assert "Waiting for other workers" in dumped.stdout
