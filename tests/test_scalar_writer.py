"""ScalarWriter: batched TensorBoard scalars, read back with TensorBoard's own loader."""

import threading

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util.tensor_util import make_ndarray

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
