"""The CLI's shared options: ``--logdir`` beside ``--log-dir``, ``--format`` on analyze,
report and lint, and the exit statuses (0 success, 1 runtime failure, 2 usage error;
``report --html`` of a run without steps: tests/test_faults.py)."""

import csv
import io
import json

import pytest

from keras_dp_tools.tools.cli import HANDLERS, build_parser, main
from tests.helpers.comparisons import write_known_comparison
from tests.helpers.doc_mentions import subcommands
from tests.helpers.pages import text_summary
from tests.helpers.processes import run_cli
from tests.helpers.recorded_runs import COMM_HEAVY, write_run

LINTED = (
    "import tensorflow as tf\n"
    "strategy = tf.distribute.MirroredStrategy()\n"
    "ds = tf.data.Dataset.range(9).batch(64)\n"  # KDP001 at line 3, column 37 (1-based)
    "dist = strategy.experimental_distribute_dataset(ds)\n"  # the data the strategy splits
)


@pytest.mark.parametrize(
    "argv",
    [
        ["demo"],
        ["sweep", "demo", "--replicas", "1,2"],
        ["launch", "--workers", "2"],
        ["tune-allreduce", "train.py"],
        ["compare-strategies", "train.py"],
    ],
)
def test_logdir_is_log_dir_spelt_as_tensorboard_spells_it(argv):
    parser = build_parser()

    dashed = parser.parse_args([*argv, "--log-dir", "runs/a"])
    tensorboard = parser.parse_args([*argv, "--logdir", "runs/a"])

    assert str(dashed.log_dir) == str(tensorboard.log_dir) == "runs/a"


def test_every_command_has_a_handler():
    assert sorted(subcommands()) == sorted(HANDLERS)


def test_every_command_with_log_dir_also_takes_logdir():
    commands = subcommands()
    with_log_dir = {
        name: {option: action.dest for action in sub._actions for option in action.option_strings}
        for name, sub in commands.items()
    }
    with_log_dir = {name: opts for name, opts in with_log_dir.items() if "--log-dir" in opts}

    assert sorted(with_log_dir) == [
        "compare-strategies",
        "demo",
        "launch",
        "sweep",
        "tune-allreduce",
    ]
    for options in with_log_dir.values():
        assert options["--logdir"] == options["--log-dir"] == "log_dir"


def test_report_format_json_holds_the_summary_and_the_advice(tmp_path, capsys):
    write_run(tmp_path, breakdown=COMM_HEAVY, replicas=4, global_batch=64, step_ms=10.0)

    status = main(["report", str(tmp_path), "--format", "json"])

    data = json.loads(capsys.readouterr().out)
    assert status == 0
    (run,) = data["summary"]
    assert run["run"] == "r1" and run["replicas"] == 4 and run["global_batch"] == 64
    assert run["median_step_ms"] == 10.0  # every unprofiled step took 10 ms
    # 4 of the 10 ms exposed all-reduce: communication-bound, the worst finding.
    assert data["advice"][0]["message"].startswith("Communication-bound")
    assert data["advice"][0]["severity"] == "warning"


def test_report_text_is_the_labelled_summary_with_how_to_read_it(tmp_path, capsys):
    write_run(tmp_path, breakdown=COMM_HEAVY, replicas=4, global_batch=64, step_ms=10.0)

    status = main(["report", str(tmp_path)])

    out = capsys.readouterr().out
    summary = text_summary(out)
    assert status == 0 and out.startswith("Summary of run r1:")
    # 3.5 ms of the 10 ms profiled step is exposed transfer: 0.35 in Report.summary().
    comm_share = {"label": "Communication share", "values": ["35.0"], "unit": "%"}
    assert summary["comm_share"] == comm_share
    assert summary["gpu_util"]["values"] == ["not measured"]  # no GPU readings, not NaN
    assert "NaN" not in out
    assert "How to read it:" in out and "keras-dp docs reading" in out


def test_report_format_csv_is_the_summary_one_row_per_run(tmp_path, capsys):
    write_run(tmp_path / "a", run="a", replicas=2, step_ms=10.0)
    write_run(tmp_path / "b", run="b", replicas=4, step_ms=12.0, start=2000.0)

    status = main(["report", str(tmp_path), "--format", "csv"])

    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert status == 0
    assert [(row["run"], row["replicas"], float(row["median_step_ms"])) for row in rows] == [
        ("a", "2", 10.0),
        ("b", "4", 12.0),
    ]


def test_report_format_csv_of_several_comparisons_is_one_table_that_says_where(tmp_path, capsys):
    write_known_comparison(tmp_path / "cpu")
    write_known_comparison(tmp_path / "gpu")

    status = main(["report", str(tmp_path), "--format", "csv"])

    out = capsys.readouterr().out
    rows = list(csv.DictReader(io.StringIO(out)))
    assert status == 0
    assert out.count("candidate") == 1  # one header
    mirrored = [row for row in rows if row["candidate"] == "mirrored"]
    assert [row["where"] for row in mirrored] == ["cpu", "gpu"]
    assert float(mirrored[0]["examples_per_s"]) == pytest.approx(45_678)


def test_report_format_csv_of_runs_says_the_comparisons_are_left_out(tmp_path, capsys):
    write_run(tmp_path, steps=12)
    write_known_comparison(tmp_path / "strategies")

    assert main(["report", str(tmp_path), "--format", "csv"]) == 0

    captured = capsys.readouterr()
    assert [row["run"] for row in csv.DictReader(io.StringIO(captured.out))] == ["r1"]
    assert "strategy comparison" in captured.err and "strategies" in captured.err
    assert "--format json" in captured.err


def test_lint_format_csv_is_one_row_per_finding(tmp_path, capsys):
    (tmp_path / "train.py").write_text(LINTED)

    status = main(["lint", str(tmp_path / "train.py"), "--format", "csv"])

    out = capsys.readouterr().out
    assert status == 1  # findings
    assert out.splitlines()[0] == "path,line,col,cell,code,severity,message"
    (row,) = csv.DictReader(io.StringIO(out))
    assert row["path"] == str(tmp_path / "train.py")
    assert (row["line"], row["col"], row["cell"], row["code"]) == ("3", "37", "", "KDP001")
    assert row["severity"] and "batch" in row["message"]


def test_lint_says_on_stderr_what_it_checked_even_when_clean(tmp_path, capsys):
    (tmp_path / "train.py").write_text(LINTED)
    (tmp_path / "clean.py").write_text("BATCH = 64  # never reaches a strategy\n")

    assert main(["lint", str(tmp_path / "clean.py")]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""  # stdout holds findings only
    assert captured.err.strip() == "keras-dp lint: 1 file checked, 0 findings"

    assert main(["lint", str(tmp_path), "--format", "json"]) == 1
    captured = capsys.readouterr()
    assert len(json.loads(captured.out)) == 1  # the JSON stays parseable
    assert captured.err.strip() == "keras-dp lint: 2 files checked, 1 finding"


def test_analyze_format_json_gives_the_step_rows(builder, tmp_path):
    from tests.helpers.gpu_traces import two_gpu_trace

    two_gpu_trace(builder).write(tmp_path)
    result = run_cli("analyze", str(tmp_path), "--format", "json")

    assert result.returncode == 0, result.stderr[-2000:]
    (step,) = json.loads(result.stdout)
    # Worked out by hand in two_gpu_trace's docstring (tests/helpers/gpu_traces.py).
    assert step["step"] == 7 and step["replicas"] == 2
    assert step["exposed_allreduce_ms"] == pytest.approx(2.25)
    assert step["xprof_collectives_ms"] == pytest.approx(1.5)
    assert step["busbw_gbps"] is None  # no bytes known: JSON's null, not NaN


def test_analyze_csv_flag_is_format_csv():
    parser = build_parser()
    assert parser.parse_args(["analyze", "x", "--csv"]).format == "csv"
    assert parser.parse_args(["analyze", "x"]).format == "text"


def test_runtime_failures_exit_1_and_usage_errors_exit_2(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 1  # no records
    assert "No keras_dp_tools records found" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "missing")]) == 1  # no log dir
    capsys.readouterr()
    assert main(["launch", "--workers", "2"]) == 2  # no command
    assert "no command to launch" in capsys.readouterr().err
    assert main(["launch", "--workers", "3", "--host-list", "a,b", "--", "true"]) == 2
    assert "--workers 3 but --host-list names 2 host(s)" in capsys.readouterr().err
    assert main(["demo", "--steps", "2", "--epochs", "3"]) == 2
    assert "--steps (2) must be at least --epochs (3)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as parsed:
        main(["report", str(tmp_path), "--format", "xml"])
    assert parsed.value.code == 2
