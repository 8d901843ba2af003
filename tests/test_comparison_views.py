"""A strategy comparison in the HTML report, the dashboard's data, ``keras-dp report`` and
``print(StrategyComparison)``: one labelled table, checked against numbers written by
hand (a comparison written by the real writer from made-up rounds; no TensorFlow)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

import keras_dp_tools as kdt
from keras_dp_tools.report.comparison import load_comparisons
from keras_dp_tools.report.html import write_html
from keras_dp_tools.report.tensorboard_plugin.data import LogDirData
from keras_dp_tools.tools.cli import main
from keras_dp_tools.tools.strategies.compare import StrategyComparison
from tests.helpers.comparisons import CODE, assert_known_table, write_known_comparison
from tests.helpers.pages import ReportPage
from tests.helpers.recorded_runs import write_run


def test_the_html_report_shows_the_verdict_table_chart_and_winners_code(tmp_path):
    write_run(tmp_path, steps=12)
    write_known_comparison(tmp_path)

    page_text = write_html(kdt.Report.load(tmp_path), tmp_path / "report.html").read_text()
    page = ReportPage(page_text)

    assert page.headings[:3] == ["h1 keras_dp_tools report", "h2 Strategy comparison", "h2 Summary"]
    verdict = page.texts["comparison-0-verdict"]
    assert verdict.startswith("mirrored: 3.70x one_device (45678 examples/s)")
    assert (
        "one_device loses (0.27x mirrored): it trains 1234 examples a step in 100.0 ms, "
        "mirrored 4568 in 100.0 ms"
    ) in verdict
    assert "Not measured: central_storage failed." in verdict
    assert_known_table(page.tables["comparison-0-table"])
    assert page.texts["comparison-0-code"] == " ".join(CODE.split())
    assert 'alt="Median over rounds; whiskers' in page_text and "data:image/png" in page_text
    assert "30 timed steps per candidate in 3 rounds" in page.texts["comparison-0"]
    assert page.summary["median_step_ms"]["label"] == "Median step time"  # the run too


def test_the_text_and_the_dashboard_show_the_same_table(tmp_path):
    write_known_comparison(tmp_path / "strategies")

    text = str(StrategyComparison.load(tmp_path / "strategies"))
    (shown,) = LogDirData(tmp_path).comparisons()

    assert shown["where"] == "strategies"
    assert shown["title"] == "Strategy comparison (strategies)"
    assert shown["verdict"].startswith("mirrored: 3.70x one_device")
    assert shown["best"] == "mirrored" and shown["code"] == CODE
    assert_known_table([shown["table"]["columns"], *shown["table"]["rows"]])
    assert shown["text_columns"] == ["Candidate", "Strategy", "Status"]
    # The text prints the same cells; the reasons go under the table.
    line = next(line for line in text.splitlines() if line.strip().startswith("mirrored"))
    assert line.split()[:4] == ["mirrored", "MirroredStrategy", "measured", "4"]
    assert "45,678" in line and "3.70" in line and "330.8 kB (model sizes)" in line
    assert "Not measured:\n  central_storage: RuntimeError: no" in text
    assert text.rstrip().endswith(CODE)
    json.dumps(shown)  # the route's answer is plain JSON


def test_a_log_dir_with_only_a_comparison_is_shown_by_the_dashboard_and_the_report(
    tmp_path, capsys
):
    from keras_dp_tools.report.tensorboard_plugin.plugin import DataParallelPlugin

    write_known_comparison(tmp_path)
    data = LogDirData(tmp_path)

    assert not data.has_records() and data.has_data()
    assert DataParallelPlugin(SimpleNamespace(logdir=str(tmp_path))).is_active()
    answer = data.runs()
    assert answer["runs"] == [] and answer["error"] is None
    assert [found["where"] for found in answer["comparisons"]] == [""]
    chart = data.figure("strategy_comparison", None, None, None, "")
    assert chart.startswith("<svg") and "Examples per second by strategy" in chart
    with pytest.raises(LookupError, match="No strategy comparison at 'elsewhere'"):
        data.figure("strategy_comparison", None, None, None, "elsewhere")

    assert main(["report", str(tmp_path), "--html", str(tmp_path / "page.html")]) == 0
    out = capsys.readouterr().out
    assert "No training records." in out and "45,678" in out and "3.70" in out
    page = ReportPage((tmp_path / "page.html").read_text())
    assert page.headings == ["h1 keras_dp_tools report", "h2 Strategy comparison"]
    assert_known_table(page.tables["comparison-0-table"])

    assert main(["report", str(tmp_path), "--format", "json"]) == 0
    data_out = json.loads(capsys.readouterr().out)
    assert data_out["summary"] == [] and data_out["advice"] == []
    assert data_out["strategy_comparisons"][0]["best"] == "mirrored"


BROKEN_RECORDS = {
    "not a comparison": ("{}", "not a strategy comparison record"),
    "no table": ('{"kind": "strategy_comparison"}', "not a readable strategy comparison"),
    "a word for a number": (
        '{"kind": "strategy_comparison", "table": [{"candidate": "mirrored", '
        '"status": "measured", "examples_per_s": "fast"}]}',
        "not a readable strategy comparison",
    ),
}


@pytest.mark.parametrize("broken", BROKEN_RECORDS, ids=list(BROKEN_RECORDS))
def test_a_broken_comparison_record_is_named_and_the_runs_still_reported(tmp_path, capsys, broken):
    content, complaint = BROKEN_RECORDS[broken]
    write_run(tmp_path, steps=12)
    write_known_comparison(tmp_path / "good")
    bad = tmp_path / "bad" / "strategy_comparison.json"
    bad.parent.mkdir()
    bad.write_text(content)

    assert main(["report", str(tmp_path), "--html", str(tmp_path / "page.html")]) == 0
    captured = capsys.readouterr()
    assert "strategy comparison left out" in captured.err and complaint in captured.err
    assert str(bad) in captured.err  # the file is named
    assert "Traceback" not in captured.err
    assert "45,678" in captured.out  # the good comparison is still reported
    headings = ReportPage((tmp_path / "page.html").read_text()).headings
    assert "h2 Summary" in headings and "h2 Strategy comparison (good)" in headings

    # The page written from the report alone skips the bad record too, with a warning.
    with pytest.warns(UserWarning, match="strategy comparison left out"):
        page = write_html(kdt.Report.load(tmp_path), tmp_path / "page2.html")
    assert "h2 Strategy comparison (good)" in ReportPage(page.read_text()).headings


@pytest.mark.parametrize("broken", BROKEN_RECORDS, ids=list(BROKEN_RECORDS))
def test_the_dashboard_keeps_saying_a_comparison_record_is_broken(tmp_path, broken):
    content, complaint = BROKEN_RECORDS[broken]
    write_known_comparison(tmp_path / "good")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "strategy_comparison.json").write_text(content)
    data = LogDirData(tmp_path)

    for _ in range(2):  # the second look at an unchanged log dir says the same
        answer = data.runs()
        assert complaint in answer["error"] and "bad" in answer["error"]
        assert [found["where"] for found in answer["comparisons"]] == ["good"]


def test_loading_a_comparison_with_a_broken_table_names_the_file(tmp_path):
    content, complaint = BROKEN_RECORDS["no table"]
    (tmp_path / "strategy_comparison.json").write_text(content)

    with pytest.raises(ValueError, match=complaint) as raised:
        StrategyComparison.load(tmp_path)
    assert str(tmp_path / "strategy_comparison.json") in str(raised.value)
    with pytest.raises(FileNotFoundError, match=r"run kdt\.compare_strategies"):
        StrategyComparison.load(tmp_path / "elsewhere")


def test_an_empty_log_dir_still_says_there_are_no_records(tmp_path, capsys):
    assert not LogDirData(tmp_path).has_data()
    assert main(["report", str(tmp_path)]) == 1
    assert "No keras_dp_tools records found" in capsys.readouterr().err
    with pytest.raises(ValueError, match="Nothing to write"):
        write_html(None, tmp_path / "page.html", comparisons=load_comparisons(tmp_path))


def test_the_chart_takes_the_log_dir_of_a_comparison(tmp_path):
    write_known_comparison(tmp_path)

    figure = kdt.plots.strategy_comparison(tmp_path)

    heights = [bar.get_height() for bar in figure.axes[0].patches]
    assert heights == pytest.approx([45_678, 12_345])  # the medians, fastest first


def test_a_comparisons_trial_runs_are_read_only_when_asked(tmp_path, capsys):
    from tests.helpers.comparisons import write_known_comparison
    from tests.helpers.recorded_runs import COMM_HEAVY, write_run

    runs = tmp_path / "runs"
    write_known_comparison(runs / "strategies")
    write_run(runs / "strategies" / "mirrored", run="trial-mirrored", breakdown=COMM_HEAVY)
    write_run(runs / "strategies", run="mine")  # the user's own run beside the comparison
    write_run(runs / "exp1", run="exp1")

    assert set(kdt.Report.load(runs).runs["run"]) == {"mine", "exp1"}
    assert "trial-mirrored" in set(kdt.Report.load(runs, trials=True).runs["run"])
    # A folder of the comparison and its trials alone: the comparison is the report.
    only = tmp_path / "only"
    write_known_comparison(only)
    write_run(only / "mirrored", run="trial-mirrored", breakdown=COMM_HEAVY)
    with pytest.raises(FileNotFoundError, match="trials=True"):
        kdt.Report.load(only)
    assert main(["report", str(only)]) == 0
    text = capsys.readouterr().out
    assert "No training records." in text and "trial-mirrored" not in text
    assert "--trials shows them" in text
    assert main(["report", str(only), "--trials"]) == 0
    assert "trial-mirrored" in capsys.readouterr().out


def test_a_trial_folder_marked_by_its_process_is_left_out_without_a_comparison(tmp_path):
    """A comparison stopped before writing its record, or tune_allreduce's log dir: the
    trial processes marked their folders (tools.tuning.child.Child)."""
    from keras_dp_tools.records.contract import TRIAL_MARKER
    from keras_dp_tools.tools.tuning.child import Child
    from tests.helpers.recorded_runs import write_run

    root = tmp_path / "tune"
    child = Child("json.tool", {}, root / "collective" / "output.log")  # a process, briefly
    child.close()
    assert (root / "collective" / TRIAL_MARKER).is_file()
    write_run(root / "collective", run="trial")
    write_run(tmp_path / "exp1", run="exp1")

    assert set(kdt.Report.load(tmp_path).runs["run"]) == {"exp1"}
    assert set(kdt.Report.load(tmp_path, trials=True).runs["run"]) == {"exp1", "trial"}
    with pytest.raises(FileNotFoundError, match="trials=True"):
        kdt.Report.load(root)
