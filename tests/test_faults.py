"""Faults injected for real: killed jobs, a full disk, restarts, files that are not ours.

Each fault leaves what a real one leaves on disk (a SIGKILL, a tmpfs that runs out of
space), and the tests check what survives and what the report says about it.
"""

import json
import os
import random
import subprocess
import sys
import warnings

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import keras_dp_tools as kdt
from keras_dp_tools.records.writer import RecordWriter, worker_records_path
from keras_dp_tools.tools.cli import main as cli_main
from tests.helpers import REPO
from tests.helpers.processes import run_cli
from tests.helpers.recorded_runs import header, step

JOB = str(REPO / "tests" / "jobs" / "train_job.py")


def run_job(log_dir, *args, env=None, timeout=300):
    return subprocess.run(
        [sys.executable, JOB, str(log_dir), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})},
    )


# -- killed before the first step -----------------------------------------------------


@pytest.mark.parametrize("content", ["header", "empty"])
def test_report_of_a_job_killed_before_its_first_step_says_so(tmp_path, capsys, content):
    path = worker_records_path(tmp_path, 0)
    path.parent.mkdir(parents=True)
    if content == "header":
        writer = RecordWriter(path)
        writer.write({**header("early"), "time": 1.0, "replicas": 2})
        writer.close()
    else:
        path.write_bytes(b"")

    status = cli_main(["report", str(tmp_path), "--html", str(tmp_path / "r.html")])

    captured = capsys.readouterr()
    out = captured.out
    assert status == 1 and "no HTML report written" in captured.err  # nothing to draw
    if content == "header":
        assert "Run early has no steps yet" in out
    else:
        assert "No runs recorded yet: the records file(s) are empty" in out
    assert "Traceback" not in out and not (tmp_path / "r.html").exists()
    assert kdt.Report.load(tmp_path).summary().empty


@pytest.mark.parametrize(
    "content",
    [
        b"hello world\nthis is a text file\n",
        b'{"name": "a json file", "n": 1}\n{"name": "another"}\n',
        bytes(range(256)) * 64,  # binary, e.g. an .xplane.pb given by mistake
    ],
    ids=["text", "json-not-records", "binary"],
)
def test_loading_a_file_that_is_not_records_says_so(tmp_path, content):
    path = tmp_path / "notes.jsonl"
    path.write_bytes(content)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "skipped damaged lines" before the verdict
        with pytest.raises(ValueError, match="is not keras_dp_tools records"):
            kdt.Report.load(path)


def test_foreign_lines_among_records_are_skipped_with_a_warning(tmp_path):
    path = worker_records_path(tmp_path, 0)
    writer = RecordWriter(path)
    writer.write({**header("r"), "time": 1.0})
    writer.write({"name": "not a record"})
    writer.write({"type": "step", "run": "r", "worker": 0, "step": 0, "steps": 1, "epoch": 0})
    writer.close()

    with pytest.warns(UserWarning, match="skipped 1 line"):
        report = kdt.Report.load(path)

    assert report.steps["step"].tolist() == [0]


# -- killed inside a profiler window --------------------------------------------------


@pytest.mark.slow
def test_kill_inside_a_profiler_window_keeps_steps_and_analysis_works(tmp_path):
    # Windows at steps 2-6 and 8-12; SIGKILL after step 9, inside the second one.
    result = run_job(
        tmp_path,
        *("--keras", "keras", "--mirrored", "2", "--epochs", "2", "--steps-per-epoch", "8"),
        *("--profile-start-step", "2", "--profile-every", "6", "--kill-at-step", "9"),
        "--kill-after-analysis",  # window 0's analysis may outlast the 3 steps to the kill
    )
    assert result.returncode == -9, result.stdout[-2000:] + result.stderr[-3000:]

    report = kdt.Report.load(tmp_path)
    assert report.steps["step"].tolist() == list(range(10))  # every completed step
    windows = report.windows.set_index("window")
    assert windows.loc[0, "status"] == "analysed"
    assert windows.loc[1, "status"] == "interrupted"
    assert "ended inside the window" in windows.loc[1, "reason"]
    assert pd.isna(report.workers.loc[0, "ended"])  # killed: no end of fit recorded
    # A capture torn while being written is skipped with its reason, the rest analysed.
    good = next((tmp_path / "train").rglob("*.xplane.pb"))
    torn = good.parent.parent / "2099_01_01_00_00_00" / good.name
    torn.parent.mkdir()
    torn.write_bytes(good.read_bytes()[: good.stat().st_size // 3])

    analysed = run_cli("analyze", str(tmp_path), "--csv")

    assert analysed.returncode == 0, analysed.stderr[-3000:]
    assert "skipped window 1 of run" in analysed.stderr
    assert f"skipped {torn}" in analysed.stderr
    steps = [line.split(",")[0] for line in analysed.stdout.splitlines()[1:]]
    assert steps == ["2", "3", "4", "5", "6"]


# -- disk full ------------------------------------------------------------------------


@pytest.mark.slow
def test_disk_full_during_training_warns_once_stops_recording_and_training_finishes(
    small_disk, keras, strategy1
):
    with strategy1.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    import numpy as np

    x = np.zeros((400, 4), "float32")
    callbacks = kdt.callbacks(small_disk / "run", profile=False, monitor=False, advise=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = model.fit(x, x[:, :1], batch_size=4, epochs=2, verbose=0, callbacks=callbacks)

    ours = [w for w in caught if issubclass(w.category, kdt.MeasurementWarning)]
    assert len(history.history["loss"]) == 2  # training finished
    assert len(ours) == 1, [str(w.message) for w in ours]
    assert "No space left on device" in str(ours[0].message)
    report = kdt.Report.load(small_disk / "run")
    recorded = report.steps["step"].tolist()
    assert 0 < len(recorded) < 200 and recorded == list(range(len(recorded)))


# -- restart after a kill (BackupAndRestore) ------------------------------------------


@pytest.mark.slow
def test_backup_and_restore_restart_continues_the_run_and_the_report_shows_it(tmp_path):
    job = {"KERAS_DP_RUN_ID": "job-7"}
    common = ("--keras", "keras", "--epochs", "2", "--steps-per-epoch", "6")
    common += ("--backup", str(tmp_path / "backup"))
    killed = run_job(tmp_path / "logs", *common, "--kill-at-step", "8", env=job)
    assert killed.returncode == -9, killed.stderr[-3000:]
    resumed = run_job(tmp_path / "logs", *common, env=job)
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    report = kdt.Report.load(tmp_path / "logs")

    steps = report.steps
    assert set(steps["run"]) == {"job-7"}
    by_attempt = steps.groupby("attempt")["step"].apply(list).to_dict()
    # Epoch 1 (steps 0-5) was backed up; the kill after step 8 lost 6-8, run again.
    assert by_attempt == {0: list(range(9)), 1: list(range(6, 12))}
    assert steps[steps["redone"]]["step"].tolist() == [6, 7, 8]
    assert not steps[~steps["redone"]].duplicated(["worker", "step"]).any()
    restart = report.restarts.iloc[0]
    assert (restart["attempt"], restart["resumed_at_step"]) == (1, 6)
    assert (restart["previous_last_step"], restart["redone_steps"]) == (8, 3)
    ended = report.workers["ended"].tolist()
    assert pd.isna(ended[0]) and ended[1] == "finished"  # killed: no end of fit recorded
    # 12 steps, less the two fits' warm-up calls (6 ran again after a warm-up, 0 first).
    assert report.summary().loc["job-7", "steps"] == 10
    assert "Restart: run job-7 worker 0 attempt 1 resumed at step 6" in report.text()


# -- property-based: the readers on random, truncated and reordered input --------------

PROPERTY = settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _records_bytes(steps: int) -> bytes:
    lines = [{**header("p"), "time": 100.0, "replicas": 2, "pid": 1, "hostname": "h"}]
    lines += [
        {**step(i, run="p"), "time": 100.0 + i, "examples_per_s": 64.0 + i} for i in range(steps)
    ]
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def _read_or_refuse(path):
    """What a reader may do with bad input: read it, or raise a clear ValueError."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return kdt.Report.load(path)
        except ValueError as error:
            assert str(path) in str(error)  # says which file
            return None


@PROPERTY
@given(data=st.binary(max_size=2000))
def test_records_reader_on_random_bytes_reads_or_refuses_clearly(tmp_path, data):
    path = tmp_path / "random.jsonl"
    path.write_bytes(data)
    _read_or_refuse(path)


@PROPERTY
@given(
    lines=st.lists(
        st.one_of(
            st.dictionaries(
                st.sampled_from(["type", "run", "worker", "step", "steps", "time", "step_ms"]),
                st.one_of(st.none(), st.integers(-5, 5), st.text(max_size=3), st.floats()),
            ),
            st.builds(lambda i: step(i, run="p"), st.integers(0, 50)),
        ),
        max_size=20,
    )
)
def test_records_reader_on_random_records_reads_or_refuses_clearly(tmp_path, lines):
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b"".join(json.dumps(line).encode() + b"\n" for line in lines))
    report = _read_or_refuse(path)
    if report is not None:
        report.text()  # the summary and advice on whatever was read must not crash


@PROPERTY
@given(cut=st.integers(0, len(_records_bytes(12))))
def test_records_truncated_anywhere_keep_every_complete_line(tmp_path, cut):
    data = _records_bytes(12)
    path = worker_records_path(tmp_path / str(cut), 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data[:cut])

    report = kdt.Report.load(path)

    complete = data[:cut].count(b"\n") - 1  # step lines that ended before the cut
    assert report.steps["step"].tolist() == list(range(max(complete, 0)))
    report.text()


@PROPERTY
@given(order=st.permutations(range(13)))
def test_records_in_any_order_give_the_same_report(tmp_path, order):
    lines = _records_bytes(12).splitlines(keepends=True)
    path = worker_records_path(tmp_path / "x".join(map(str, order[:4])), 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(lines[i] for i in order))

    steps = kdt.Report.load(path).steps

    assert steps["step"].tolist() == list(range(12))
    assert steps["step_ms"].tolist() == [10.0 + i for i in range(12)]


@pytest.fixture(scope="module")
def cpu_trace_bytes(tf):
    from tests.helpers.cpu_traces import cpu_trace
    from tests.helpers.xplane_builder import SpaceBuilder

    return cpu_trace(SpaceBuilder).space.SerializeToString()


def _analyze_or_refuse(path):
    from keras_dp_tools.analysis import analyze_trace

    try:
        return analyze_trace(path, xprof=False)
    except ValueError as error:
        assert str(path) in str(error)
        return None


@PROPERTY
@given(data=st.binary(max_size=3000))
def test_trace_reader_on_random_bytes_reads_or_refuses_clearly(tmp_path, data, tf):
    path = tmp_path / "random.xplane.pb"
    path.write_bytes(data)
    _analyze_or_refuse(path)


@PROPERTY
@given(fraction=st.floats(0.0, 1.0))
def test_trace_reader_on_truncated_captures_reads_or_refuses_clearly(
    tmp_path, fraction, cpu_trace_bytes
):
    path = tmp_path / "torn.xplane.pb"
    path.write_bytes(cpu_trace_bytes[: int(fraction * len(cpu_trace_bytes))])
    _analyze_or_refuse(path)


@PROPERTY
@given(seed=st.integers(0, 2**32 - 1))
def test_trace_reader_result_does_not_depend_on_event_order(tmp_path, seed, cpu_trace_bytes, tf):
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    from keras_dp_tools.analysis import analyze_xspace

    space = xplane_pb2.XSpace.FromString(cpu_trace_bytes)
    shuffled = xplane_pb2.XSpace.FromString(cpu_trace_bytes)
    rng = random.Random(seed)

    def shuffle(field):  # repeated proto fields cannot be shuffled in place
        items = [type(item).FromString(item.SerializeToString()) for item in field]
        rng.shuffle(items)
        del field[:]
        field.extend(items)

    for plane in shuffled.planes:
        shuffle(plane.lines)
        for line in plane.lines:
            shuffle(line.events)

    expected = analyze_xspace(space).replicas
    got = analyze_xspace(shuffled).replicas

    pd.testing.assert_frame_equal(got, expected)
