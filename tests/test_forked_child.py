"""A child forked from a training process must leave the parent's records alone.

A user's ``os.fork()`` (or multiprocessing's fork start method) inherits our exit
handlers, recorders and their buffered records. At the child's exit those handlers
wrote the parent's buffered steps a second time and a false ``fit_end`` ("exited")
into the parent's records file.
"""

from __future__ import annotations

import gc
import json
import os
import time

import keras_dp_tools as kdt
from keras_dp_tools.capture import data_parallel_profiler, step_timer
from keras_dp_tools.capture.recorder import Recorder
from keras_dp_tools.records.contract import FLUSH_SECONDS_ENV
from keras_dp_tools.records.writer import worker_records_path
from tests.helpers.training import fit


def _exit_handlers_of_a_normal_exit() -> None:
    # What our atexit registrations run when a process exits normally. The child runs
    # only these (then os._exit): TensorFlow's own teardown in a forked child is not
    # what this test is about.
    step_timer._end_open_fits()
    data_parallel_profiler._close_open_windows()
    Recorder.flush_all()


def _wait(pid: int, seconds: float) -> int:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise AssertionError(f"the forked child still ran after {seconds} s: it hung")


def test_a_child_forked_during_fit_writes_nothing_into_the_parents_records(
    tmp_path, keras, strategy4, monkeypatch
):
    monkeypatch.setenv(FLUSH_SECONDS_ENV, "3600")  # steps wait in memory until epoch end
    children = []

    class ForkAtBatch3(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch != 3:
                return
            # Frozen, the parent's objects are never collected in the child: freeing
            # TensorFlow objects there crashes (TensorFlow is not fork-safe).
            gc.freeze()
            pid = os.fork()
            if pid == 0:  # the child: exits at once, as a worker process would
                code = 0
                try:
                    _exit_handlers_of_a_normal_exit()
                except BaseException:
                    code = 3
                os._exit(code)
            gc.unfreeze()
            children.append(pid)

    from tests.helpers.training import dense_model

    fit(dense_model(keras, strategy4), [kdt.StepTimer(tmp_path), ForkAtBatch3()], epochs=1)

    assert [_wait(pid, 60) for pid in children] == [0]
    lines = worker_records_path(tmp_path, 0).read_text().splitlines()
    records = [json.loads(line) for line in lines]
    steps = [r["step"] for r in records if r["type"] == "step"]
    ends = [r["status"] for r in records if r["type"] == "fit_end"]
    assert steps == list(range(7)), steps  # each step once: the child wrote none of them
    assert ends == ["finished"], ends  # no "exited" from the child's exit


def test_a_child_forked_while_a_record_is_written_can_release_its_inherited_recorder(
    tmp_path,
):
    recorder = Recorder.acquire(tmp_path, 0)
    recorder.start_run({"strategy": "MirroredStrategy", "replicas": 2})
    records = recorder._records
    records._lock.acquire()  # as a thread of the parent inside write_line at the fork
    gc.freeze()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            recorder.write("step", time=time.time(), step=99)  # dropped: the parent's file
            recorder.release()  # what the child's on_train_end would do
            code = 0
        finally:
            os._exit(code)
    gc.unfreeze()
    records._lock.release()
    try:
        assert _wait(pid, 30) == 0
        recorder.write("step", time=time.time(), step=0)
    finally:
        recorder.release()
    lines = worker_records_path(tmp_path, 0).read_text().splitlines()
    assert [json.loads(line).get("step") for line in lines] == [None, 0]  # header, step 0


class FreedElsewhere(Exception):
    """An error that notes, when freed, in which other process that happened."""

    def __init__(self, note_path):
        super().__init__("no space left on device")
        self.note_path, self.maker = str(note_path), os.getpid()

    def __del__(self):
        if os.getpid() != self.maker:
            descriptor = os.open(self.note_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            os.write(descriptor, b"freed in a forked child\n")
            os.close(descriptor)


def test_a_forked_child_frees_nothing_the_parents_recorders_held(tmp_path):
    # Freed in a child, an object holding TensorFlow state (an old write error's
    # traceback holds tensors) crashed it: CI's forked children segfaulted so.
    from keras_dp_tools.capture.scalar_writer import ScalarWriter

    note = tmp_path / "freed.txt"
    recorder = Recorder.acquire(tmp_path / "run", 0)
    recorder.start_run({"strategy": "MirroredStrategy", "replicas": 2})
    writer = ScalarWriter(str(tmp_path / "run" / "tb"))
    # The states a full disk leaves (made directly here: a real one is test_faults's).
    recorder.write_error = FreedElsewhere(note)
    writer._error = FreedElsewhere(note)
    recorder.flush_seconds = 3600  # the record stays pending (a flusher may run)
    recorder._pending.append({"type": "step", "held": FreedElsewhere(note)})
    gc.collect()  # the errors above are freed by reference counts, not by collection
    gc.freeze()
    pid = os.fork()
    if pid == 0:  # the at-fork handlers have run; nothing else
        os._exit(0)
    gc.unfreeze()
    try:
        assert _wait(pid, 30) == 0
    finally:
        recorder.write_error = writer._error = None
        recorder._pending.clear()
        recorder.release()
        writer.close()
    assert not note.exists(), note.read_text()
