"""TensorBoard scalars written in batches, to keep them off the step's critical path.

An eager ``tf.summary.scalar`` costs about 0.3 ms of the training thread per point, a
few percent of a short step, and a compiled writing loop costs a trace (about 0.25 s)
in every ``fit``. Points are buffered instead, and written as TensorBoard ``Event``
protos (the format ``tf.summary`` writes) through TensorFlow's record writer: about
15 µs a point, no graph, no tracing.

Tags are grouped by their first path part, which TensorBoard shows as one section
each: ``dp/`` (the headline step time and throughput), ``dp_window/`` (the breakdown of
profiled steps only), ``dp_window_other/`` (its ``other_ms`` split), ``gpu/`` and
``host/``. Every tag's first point carries a
description (TensorBoard shows it on the chart) that says what the tag measures, on
which step axis, and where its points are missing on purpose.
"""

from __future__ import annotations

import functools
import itertools
import os
import socket
import time

# The x axis of every tag: the global step (optimizer.iterations), which counts
# batches. Keras's own "train" run plots epoch_* tags against epochs.
STEP_AXIS = "x axis: global step (batches, optimizer.iterations), not epochs."
# Tag (or group, ending in "/") -> what TensorBoard shows under its chart.
TAG_DESCRIPTIONS = {
    "dp/step_ms": "Host wall time per training step, ms. Leaves out the first call of "
    "each fit (tracing, compilation) and steps slowed by profiling: those are in "
    "dp/step_ms_disturbed.",
    "dp/examples_per_s": "Examples per second over all replicas, on the steps of dp/step_ms.",
    "dp/step_ms_disturbed": "Wall time of the steps left out of dp/step_ms: warm-up "
    "(tracing, compilation) and steps captured or slowed by a profiler window.",
    "dp_window/": "Breakdown of profiled steps only (inside profiler windows); the lines "
    "TensorBoard draws between windows are not data. Set smoothing to 0. The Data "
    "parallel tab shows each window as stacked bars.",
    "dp_window_other/": "other_ms of profiled steps split: dispatch (host time around the "
    "train function), idle (no replica runs anything), scheduling (this replica waits "
    "while others run). Profiled steps only; the lines between windows are not data.",
    "gpu/": "NVML reading of one GPU, written every couple of seconds.",
    "host/": "CPU usage in % of all cores of the host (100 = every core busy).",
}


def tag_description(tag: str) -> str:
    """The description of ``tag`` (its own, else its group's) with the step axis."""
    group = tag.split("/", 1)[0] + "/"
    text = TAG_DESCRIPTIONS.get(tag) or TAG_DESCRIPTIONS.get(group, "")
    return f"{text} {STEP_AXIS}".strip()


@functools.lru_cache(maxsize=256)
def _scalar_metadata(tag: str) -> bytes:
    from tensorboard.plugins.scalar import metadata

    return metadata.create_summary_metadata(
        display_name=None, description=tag_description(tag)
    ).SerializeToString()


_EVENT_FILE_SERIAL = itertools.count()


def _event_file_name(run_dir: str) -> str:
    # TensorBoard reads every file named events.out.tfevents.* in a run folder; the
    # counter keeps two writers of one process and second apart.
    return os.path.join(
        run_dir,
        f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}."
        f"{os.getpid()}.{next(_EVENT_FILE_SERIAL)}.v2",
    )


class ScalarWriter:
    """Buffers scalar points for one TensorBoard run folder and writes them in batches.

    Points are written when ``flush_points`` are buffered, when a point arrives
    ``flush_seconds`` or more after the last write (so TensorBoard follows a live
    run), and on ``flush`` and ``close``. Each point keeps the wall time it was added
    at.

    Args:
        run_dir: the TensorBoard run folder to write event files into.
        flush_points: buffered points that trigger a write.
        flush_seconds: time since the last write after which a new point is written
            at once.
    """

    def __init__(self, run_dir: str, flush_points: int = 512, flush_seconds: float = 5.0):
        self.run_dir = run_dir
        self.flush_points = flush_points
        self.flush_seconds = flush_seconds
        self._points: list[tuple[float, int, dict[str, float]]] = []
        self._buffered = 0
        self._last_write = time.monotonic()
        self._file = None  # a tf.io.TFRecordWriter, opened at the first write
        self._described: set[str] = set()  # tags whose first point (with metadata) is out

    def add(self, step: int, values: dict[str, float | None]) -> None:
        """Adds one point per tag at ``step``; None values are not measured and skipped."""
        measured = {tag: value for tag, value in values.items() if value is not None}
        if measured:
            self._points.append((time.time(), int(step), measured))
            self._buffered += len(measured)
        if (
            self._buffered >= self.flush_points
            or time.monotonic() - self._last_write >= self.flush_seconds
        ):
            self.flush()

    def flush(self) -> None:
        self._last_write = time.monotonic()
        if not self._buffered:
            return
        from tensorboard.compat.proto import event_pb2, types_pb2

        self._ensure_file()
        points, self._points, self._buffered = self._points, [], 0
        for wall_time, step, values in points:
            event = event_pb2.Event(wall_time=wall_time, step=step)
            for tag, value in values.items():
                summary = event.summary.value.add(tag=tag)
                if tag not in self._described:
                    self._described.add(tag)
                    summary.metadata.ParseFromString(_scalar_metadata(tag))
                summary.tensor.dtype = types_pb2.DT_FLOAT
                summary.tensor.tensor_shape.SetInParent()  # a scalar
                summary.tensor.float_val.append(value)
            self._file.write(event.SerializeToString())
        self._file.flush()

    def write_text(self, tag: str, markdown: str, step: int = 0) -> None:
        """Writes a text summary (TensorBoard's Text tab renders markdown) at once."""
        from tensorboard.compat.proto import event_pb2
        from tensorboard.plugins.text.summary_v2 import text_pb

        self._ensure_file()
        event = event_pb2.Event(wall_time=time.time(), step=step, summary=text_pb(tag, markdown))
        self._file.write(event.SerializeToString())
        self._file.flush()

    def _ensure_file(self) -> None:
        if self._file is None:
            import tensorflow as tf
            from tensorboard.compat.proto import event_pb2

            tf.io.gfile.makedirs(self.run_dir)
            self._file = tf.io.TFRecordWriter(_event_file_name(self.run_dir))
            version = event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2")
            self._file.write(version.SerializeToString())

    def close(self) -> None:
        try:
            self.flush()
        finally:
            if self._file is not None:
                self._file.close()
                self._file = None
