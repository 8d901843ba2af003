"""Our callbacks' cost on the training thread, and what batched records keep on a crash.

The cost is measured as a ratio in one run: thread CPU time inside our hooks per step
over the wall time of a bare step (no timed assertions; a busy machine only makes the
bare step longer). Crashes are real: a child process SIGKILLs itself.
"""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import keras_dp_tools as kdt
from benchmarks.hook_timing import HookTimer
from keras_dp_tools.capture.recorder import Recorder, flush_seconds
from keras_dp_tools.records.contract import FLUSH_SECONDS_ENV
from keras_dp_tools.records.writer import worker_records_path
from tests.helpers import REPO


def step_begins(keras):
    times = []

    class Clock(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            times.append(time.perf_counter())

    return times, Clock()


@pytest.mark.slow
def test_always_on_hooks_take_a_small_share_of_a_bare_step(tmp_path, keras, strategy4):
    with strategy4.scope():
        model = keras.Sequential(
            [keras.Input((256,)), keras.layers.Dense(256, "relu"), keras.layers.Dense(1)]
        )
        model.compile(optimizer="adam", loss="mse")
    x = np.random.default_rng(0).normal(size=(256 * 30, 256)).astype("float32")
    model.fit(x, x[:, :1], batch_size=256, verbose=0)  # trace and compile
    bare, clock = step_begins(keras)
    model.fit(x, x[:, :1], batch_size=256, verbose=0, callbacks=[clock])
    ours = [kdt.StepTimer(tmp_path, global_batch=256), kdt.GpuMonitor(tmp_path)]
    timer = HookTimer(ours)

    model.fit(x, x[:, :1], batch_size=256, verbose=0, callbacks=ours)

    bare_step_s = float(np.median(np.diff(bare)))
    assert timer.steps == 30
    assert timer.batch_cpu_s / timer.steps < 0.05 * bare_step_s
    assert len(kdt.Report.load(tmp_path).steps) == 30  # and they measured


def test_records_of_an_epoch_are_on_disk_when_the_next_epoch_begins(
    tmp_path, keras, strategy4, monkeypatch
):
    monkeypatch.setenv(FLUSH_SECONDS_ENV, "3600")  # only the epoch end writes them
    seen = []

    class ReadAtEpochBegin(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            path = worker_records_path(tmp_path, 0)
            lines = path.read_text().splitlines() if path.exists() else []
            seen.append(sum(json.loads(line)["type"] == "step" for line in lines))

    from tests.helpers.training import dense_model, fit

    fit(dense_model(keras, strategy4), [kdt.StepTimer(tmp_path), ReadAtEpochBegin()], epochs=3)

    assert seen == [0, 7, 14]  # 7 steps per epoch, each epoch's written at its end


CHILD = """
import os, signal, sys, time
sys.path.insert(0, sys.argv[1])
from keras_dp_tools.capture.recorder import Recorder
recorder = Recorder.acquire(sys.argv[2], 0)
recorder.start_run({"strategy": "MirroredStrategy", "replicas": 2})
KEYS = ("time", "step", "steps", "step_ms")
def steps(first, last):  # as StepTimer writes them
    for step in range(first, last):
        recorder.write_values("step", KEYS, (time.time(), step, 1, 1.0))
steps(0, 5)
recorder.write("window", time=time.time(), start_step=5, status="open")  # at once
steps(5, 10)
if sys.argv[3] == "hang":  # a stuck all-reduce: only the flusher thread can write now
    deadline = time.monotonic() + 60
    while recorder.records_path.read_bytes().count(b"\\n") < 12 and time.monotonic() < deadline:
        time.sleep(0.05)
if sys.argv[3] == "raise":
    raise RuntimeError("training failed")
os.kill(os.getpid(), signal.SIGKILL)
"""


def run_child(log_dir, how: str, seconds: str):
    return subprocess.run(
        [sys.executable, "-c", CHILD, str(REPO), str(log_dir), how],
        env={**os.environ, FLUSH_SECONDS_ENV: seconds},
        capture_output=True,
        text=True,
        timeout=120,
    )


def recorded(log_dir) -> list[tuple[str, int | None]]:
    lines = worker_records_path(log_dir, 0).read_text().splitlines()
    records = [json.loads(line) for line in lines]
    return [(r["type"], r.get("step", r.get("start_step"))) for r in records]


STEPS = [("step", step) for step in range(10)]
WINDOW = ("window", 5)


def test_sigkill_keeps_every_record_written_before_the_last_flush(tmp_path):
    done = run_child(tmp_path, "kill", "3600")

    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    # The window record pushed steps 0-4 out before it; 5-9 waited in memory.
    assert recorded(tmp_path) == [("header", None), *STEPS[:5], WINDOW]


def test_sigkill_by_default_keeps_every_record(tmp_path):
    done = run_child(tmp_path, "kill", "")  # unset: nothing waits in memory

    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert recorded(tmp_path) == [("header", None), *STEPS[:5], WINDOW, *STEPS[5:]]


def test_sigkill_after_a_hang_keeps_the_steps_before_it(tmp_path):
    done = run_child(tmp_path, "hang", "0.2")  # the flusher writes while nothing steps

    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert recorded(tmp_path) == [("header", None), *STEPS[:5], WINDOW, *STEPS[5:]]


def test_an_exception_loses_nothing(tmp_path):
    done = run_child(tmp_path, "raise", "3600")

    assert done.returncode == 1 and "training failed" in done.stderr
    assert recorded(tmp_path) == [("header", None), *STEPS[:5], WINDOW, *STEPS[5:]]


def test_flush_seconds_zero_writes_each_record_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv(FLUSH_SECONDS_ENV, "0")
    recorder = Recorder.acquire(tmp_path, 0)
    try:
        recorder.start_run({"strategy": "MirroredStrategy"})
        recorder.write("step", step=0, steps=1, step_ms=1.0)
        assert recorded(tmp_path) == [("header", None), ("step", 0)]
    finally:
        recorder.release()


def test_a_bad_flush_interval_says_what_it_received():
    with pytest.raises(ValueError, match=r"KERAS_DP_FLUSH_SECONDS .* received 'soon'"):
        flush_seconds({FLUSH_SECONDS_ENV: "soon"})
    assert flush_seconds({}) == 0.0 and flush_seconds({FLUSH_SECONDS_ENV: "2.5"}) == 2.5


def test_hook_timer_counts_one_entry_per_train_call_and_leaves_unused_hooks_alone():
    from keras_dp_tools.capture.base import DataParallelCallback

    class Both(DataParallelCallback):
        def on_train_batch_begin(self, batch, logs=None):
            self.begun = batch

        def on_train_batch_end(self, batch, logs=None):
            self.ended = batch

    class EndOnly(DataParallelCallback):
        def on_train_batch_end(self, batch, logs=None):
            self.ended = batch

    both, end_only = Both(), EndOnly()
    timer = HookTimer([both, end_only])
    assert getattr(end_only.on_train_batch_begin, "_is_default", False)  # still skipped
    for first, last in ((0, 2), (3, 5), (6, 6)):  # calls of 3, 3 and 1 steps
        for callback in (both, end_only):
            callback.on_train_batch_begin(first)
        for callback in (both, end_only):
            callback.on_train_batch_end(last)

    assert timer.steps == 3 and len(timer.per_step_wall_s) == len(timer.per_step_cpu_s) == 3
    assert dict(timer.calls) == {"on_train_batch_begin": 3, "on_train_batch_end": 6}
    assert timer.batch_wall_s == pytest.approx(sum(timer.per_step_wall_s))
    assert (both.begun, both.ended, end_only.ended) == (6, 6, 6)
    timer.restore()
    assert "on_train_batch_end" not in vars(both)


def test_a_runs_offset_is_where_its_header_line_begins(tmp_path, monkeypatch):
    monkeypatch.delenv("KERAS_DP_RUN_ID", raising=False)
    monkeypatch.setenv(FLUSH_SECONDS_ENV, "3600")  # buffered steps are written first
    recorder = Recorder.acquire(tmp_path, 0)
    try:
        first = recorder.start_run({"strategy": "MirroredStrategy", "replicas": 2})
        recorder.write("step", step=0, steps=1, step_ms=1.0)
        second = recorder.start_run({"strategy": "MirroredStrategy", "replicas": 4})
        offset = recorder.run_offset
        recorder.write("step", step=0, steps=1, step_ms=2.0)
        recorder.flush()
    finally:
        recorder.release()
    content = worker_records_path(tmp_path, 0).read_bytes()
    lines = content.splitlines(keepends=True)
    runs = [json.loads(line)["run"] for line in lines]
    assert runs == [first, first, second, second]
    assert offset == len(lines[0]) + len(lines[1])  # the byte where the 2nd header begins

    report = kdt.Report.from_files([(worker_records_path(tmp_path, 0), offset)])
    assert report.runs["run"].tolist() == [second]
    assert report.steps["step_ms"].tolist() == [2.0]


def test_a_launcher_given_run_id_is_read_from_the_start(tmp_path, monkeypatch):
    # A restarted process continues its run: the run's earlier lines come before it.
    monkeypatch.setenv("KERAS_DP_RUN_ID", "job-1")
    recorder = Recorder.acquire(tmp_path, 0)
    try:
        recorder.start_run({"strategy": "MirroredStrategy", "replicas": 2})
        assert recorder.run_offset == 0
    finally:
        recorder.release()


def test_step_records_of_the_template_equal_the_general_ones_and_follow_the_run(
    tmp_path, monkeypatch
):
    monkeypatch.delenv("KERAS_DP_RUN_ID", raising=False)
    monkeypatch.delenv(FLUSH_SECONDS_ENV, raising=False)
    keys = ("time", "epoch", "step", "steps", "step_ms", "examples_per_s", "warmup")
    cases = [
        (1764461520.25, 0, 0, 1, 812.5, None, True),
        (1764461521.5, 0, 1, 4, 15.125, 33000.5, False),
        (1764461522.0, 1, 5, 1, float("nan"), float("inf"), False),  # json's path: null
    ]
    recorder = Recorder.acquire(tmp_path, 0)
    try:
        runs = [recorder.start_run({"strategy": "MirroredStrategy", "replicas": 2})]
        for values in cases:
            recorder.write_values("step", keys, values)
            recorder.write("step", **dict(zip(keys, values, strict=True)))
        runs.append(recorder.start_run({"strategy": "MirroredStrategy", "replicas": 4}))
        recorder.write_values("step", keys, cases[0])
    finally:
        recorder.release()

    lines = worker_records_path(tmp_path, 0).read_bytes().splitlines()
    steps = [json.loads(line) for line in lines if b'"type":"step"' in line]
    assert lines[1:7:2] == lines[2:8:2]  # template and json wrote the same bytes
    assert steps[4]["step_ms"] is None and steps[4]["examples_per_s"] is None
    assert [step["run"] for step in steps] == [runs[0]] * 6 + [runs[1]]
    assert steps[0] == {
        "type": "step",
        "run": runs[0],
        "worker": 0,
        **dict(zip(keys, cases[0], strict=True)),
    }


def test_a_step_value_json_refuses_drops_that_record_alone_with_one_warning(tmp_path, monkeypatch):
    monkeypatch.delenv(FLUSH_SECONDS_ENV, raising=False)
    recorder = Recorder.acquire(tmp_path, 0)
    try:
        recorder.start_run({"strategy": "MirroredStrategy"})
        with pytest.warns(kdt.MeasurementWarning, match="could not write a 'step' record"):
            recorder.write_values("step", ("step",), (10**5000,))  # past int's print limit
        recorder.write_values("step", ("step",), (3,))
    finally:
        recorder.release()
    assert recorded(tmp_path) == [("header", None), ("step", 3)]


def test_a_step_written_after_the_recorder_closed_is_dropped_like_any_record(tmp_path, monkeypatch):
    monkeypatch.delenv(FLUSH_SECONDS_ENV, raising=False)
    recorder = Recorder.acquire(tmp_path, 0)
    recorder.start_run({"strategy": "MirroredStrategy"})
    recorder.write_values("step", ("step",), (1,))
    recorder.release()  # the file is closed; a late hook must not raise into training
    with pytest.warns(kdt.MeasurementWarning, match="closed"):
        recorder.write_values("step", ("step",), (2,))
    recorder.write("step", step=3)  # the general path drops it too (warned once)
    assert recorded(tmp_path) == [("header", None), ("step", 1)]
