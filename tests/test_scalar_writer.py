"""ScalarWriter: batched TensorBoard scalars, read back with TensorBoard's own loader."""

import ctypes
import gc
import os
import signal
import threading
import time
import warnings

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.util.tensor_util import make_ndarray

from keras_dp_tools.capture import scalar_writer
from keras_dp_tools.capture.base import MeasurementWarning
from keras_dp_tools.capture.recorder import Recorder
from keras_dp_tools.capture.scalar_writer import THREAD_NAME, ScalarWriter


def read_scalars(run_dir) -> dict[str, list[tuple[int, float]]]:
    accumulator = EventAccumulator(str(run_dir), size_guidance={"tensors": 0})
    accumulator.Reload()
    return {
        tag: [
            (event.step, make_ndarray(event.tensor_proto).item())
            for event in accumulator.Tensors(tag)
        ]
        for tag in accumulator.Tags()["tensors"]
    }


def test_points_are_written_on_close_and_none_is_skipped(tf, tmp_path):
    writer = ScalarWriter(str(tmp_path), flush_seconds=3600)
    writer.add(0, {"dp/step_ms": 10.5, "dp/examples_per_s": None})
    writer.add(1, {"dp/step_ms": 12.0, "dp/examples_per_s": 800.0})
    assert read_scalars(tmp_path) == {}  # buffered

    writer.close()

    assert read_scalars(tmp_path) == {
        "dp/step_ms": [(0, 10.5), (1, 12.0)],
        "dp/examples_per_s": [(1, 800.0)],
    }


def test_a_full_buffer_is_written_at_once(tf, tmp_path):
    writer = ScalarWriter(str(tmp_path), flush_points=3, flush_seconds=3600)
    for step in range(4):
        writer.add(step, {"dp/step_ms": float(step)})
    writer.wait()  # the writing thread has the first three

    assert [step for step, _ in read_scalars(tmp_path)["dp/step_ms"]] == [0, 1, 2]
    writer.close()
    assert [step for step, _ in read_scalars(tmp_path)["dp/step_ms"]] == [0, 1, 2, 3]


def test_old_points_are_written_after_flush_seconds(tf, tmp_path):
    writer = ScalarWriter(str(tmp_path), flush_seconds=0)
    writer.add(7, {"dp/step_ms": 1.0})
    writer.wait()

    assert read_scalars(tmp_path) == {"dp/step_ms": [(7, 1.0)]}
    writer.close()


def test_every_tag_says_what_it_is_and_text_reaches_the_text_tab(tf, tmp_path):
    writer = ScalarWriter(str(tmp_path), flush_seconds=3600)
    writer.add(3, {"dp/step_ms": 2.5, "gpu/0/util": 80.0})
    writer.add(4, {"dp/step_ms": 3.5})
    writer.write_text("advice", "**slow** input", step=4)
    writer.close()
    accumulator = EventAccumulator(str(tmp_path), size_guidance={"tensors": 0})
    accumulator.Reload()

    assert "not epochs" in accumulator.SummaryMetadata("dp/step_ms").summary_description
    assert accumulator.SummaryMetadata("gpu/0/util").plugin_data.plugin_name == "scalars"
    text = accumulator.Tensors("advice")[0]
    assert make_ndarray(text.tensor_proto).item() == b"**slow** input"
    assert accumulator.SummaryMetadata("advice").plugin_data.plugin_name == "text"
    assert read_scalars(tmp_path)["dp/step_ms"] == [(3, 2.5), (4, 3.5)]


def writing_threads():
    return [thread for thread in threading.enumerate() if thread.name == THREAD_NAME]


def test_points_are_written_off_the_adding_thread_and_the_thread_ends_on_close(tf, tmp_path):
    writer = ScalarWriter(str(tmp_path), flush_points=4, flush_seconds=3600)
    written_by = []
    write = writer._write

    def noting_thread(points):
        written_by.append(threading.current_thread().name)
        write(points)

    writer._write = noting_thread
    for step in range(10):
        writer.add(step, {"dp/step_ms": float(step), "dp/examples_per_s": 1.0})
    writer.close()

    assert len(written_by) == 5 and set(written_by) == {THREAD_NAME}
    assert [step for step, _ in read_scalars(tmp_path)["dp/step_ms"]] == list(range(10))
    assert not writing_threads()


def test_none_values_do_not_count_toward_a_write(tf, tmp_path):
    writer = ScalarWriter(str(tmp_path), flush_points=4, flush_seconds=3600)
    for step in range(3):
        writer.add(step, {"dp/step_ms": float(step), "dp/examples_per_s": None})
    writer.wait()
    assert read_scalars(tmp_path) == {}  # 3 values to write: under flush_points

    writer.add(3, {"dp/step_ms": 3.0, "dp/examples_per_s": None})
    writer.wait()
    assert [step for step, _ in read_scalars(tmp_path)["dp/step_ms"]] == [0, 1, 2, 3]
    writer.close()


def points_per_file(run_dir) -> dict[int, list[tuple[int, str, float]]]:
    """{pid in the file name: [(step, tag, value), ...] in file order}, by TensorBoard's
    own event file loader."""
    files = {}
    for path in sorted(run_dir.glob("events.out.tfevents.*")):
        pid = int(path.name.split(".")[-3])
        assert pid not in files, f"two event files of process {pid}"
        files[pid] = [
            (event.step, value.tag, make_ndarray(value.tensor).item())
            for event in EventFileLoader(str(path)).Load()
            for value in event.summary.value
        ]
    return files


def wait_for_child(pid: int, seconds: float) -> int:
    """The exit code of child ``pid``; kills it and fails if it runs longer."""
    deadline = time.monotonic() + seconds
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(f"the forked child still ran after {seconds} s: it hung")
        time.sleep(0.02)


def test_a_child_forked_while_the_thread_writes_neither_hangs_nor_writes_the_parents_points(
    tf, tmp_path, monkeypatch
):
    writer = ScalarWriter(str(tmp_path), flush_points=10, flush_seconds=3600)
    in_batch, forked = threading.Event(), threading.Event()
    describe = scalar_writer._scalar_metadata

    def describe_after_fork(tag):  # runs on the writing thread, which holds the file lock
        if tag == "gpu/0/util":
            in_batch.set()
            forked.wait(30)
        return describe(tag)

    monkeypatch.setattr(scalar_writer, "_scalar_metadata", describe_after_fork)
    for step in range(9):
        writer.add(step, {"dp/step_ms": float(step)})
    # The 10th value hands the batch over; its new tag stops the thread halfway through
    # it, with steps 0-8 in the file's buffer, not yet on disk.
    writer.add(9, {"dp/step_ms": 9.0, "gpu/0/util": 50.0})
    assert in_batch.wait(30)
    # At the fork, steps 10-19 wait for the thread and steps 20-22 in the buffer.
    for step in range(10, 23):
        writer.add(step, {"dp/step_ms": float(step)})

    # Garbage of earlier tests (TensorFlow functions) is collected here, and the rest
    # frozen: freeing TensorFlow objects in the forked child crashes (TensorFlow is not
    # fork-safe); the child frees only what it makes and lets go of itself.
    gc.collect()
    gc.freeze()
    pid = os.fork()
    if pid == 0:  # the child: only this thread exists; never returns into pytest
        code = 1
        try:
            writer.add(100, {"dp/step_ms": 100.0})
            writer.flush()
            writer.close()
            del writer
            gc.collect()  # frees what the child let go of (a parent's file would flush)
            ctypes.CDLL(None).fflush(None)  # what the C library does at a normal exit
            code = 0
        finally:
            os._exit(code)
    gc.unfreeze()
    try:
        assert wait_for_child(pid, 30) == 0
    finally:
        forked.set()
    writer.close()

    files = points_per_file(tmp_path)
    assert files == {
        os.getpid(): [(step, "dp/step_ms", float(step)) for step in range(10)]
        + [(9, "gpu/0/util", 50.0)]
        + [(step, "dp/step_ms", float(step)) for step in range(10, 23)],
        pid: [(100, "dp/step_ms", 100.0)],
    }


def test_after_a_full_disk_the_writer_stops_and_the_file_keeps_what_was_written(
    tf,
    small_disk,
):
    run_dir = small_disk / "run"
    writer = ScalarWriter(str(run_dir), flush_points=16, flush_seconds=3600)
    errors, step = [], 0
    while not errors and step < 20_000:
        try:
            writer.add(step, {"dp/step_ms": float(step)})
            if step % 16 == 15:
                writer.wait()
        except Exception as error:  # TensorFlow's ResourceExhaustedError
            errors.append(error)
        step += 1
    assert errors and "No space left on device" in str(errors[0])
    (events_file,) = run_dir.glob("events.out.tfevents.*")
    size = events_file.stat().st_size

    (small_disk / "filler").unlink()  # room again: still nothing more is written
    for later in range(step, step + 100):
        writer.add(later, {"dp/step_ms": float(later)})
    writer.flush()
    writer.write_text("advice", "dropped")
    writer.close()  # nothing raised: the error was raised once

    assert events_file.stat().st_size == size
    written = [step for step, _, _ in points_per_file(run_dir)[os.getpid()]]
    assert 0 < len(written) < step and written == list(range(len(written)))


def test_a_full_disk_under_the_recorder_warns_once_and_raises_nothing(
    tf,
    small_disk,
):
    recorder = Recorder.acquire(small_disk / "logs", 0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for start in range(0, 4096, 64):
            points = [(time.time(), step, {"dp/step_ms": 1.0}) for step in range(start, start + 64)]
            recorder.scalar_points(points)
            recorder.flush()
        recorder.release()

    ours = [str(w.message) for w in caught if issubclass(w.category, MeasurementWarning)]
    assert len(ours) == 1 and "No space left on device" in ours[0], ours
