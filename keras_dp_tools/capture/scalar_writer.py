"""TensorBoard scalars written in batches, to keep them off the step's critical path.

An eager ``tf.summary.scalar`` costs about 0.3 ms of the training thread per point,
a few percent of a short step. Points are buffered and written by a compiled loop,
one call per tag and flush, at about 30 µs a point.

Tags are grouped by their first path part, which TensorBoard shows as one section
each: ``dp/`` (the headline step time and throughput), ``dp_window/`` (the breakdown of
profiled steps only), ``dp_window_other/`` (its ``other_ms`` split), ``gpu/`` and
``host/``. Every tag's first point carries a
description (TensorBoard shows it on the chart) that says what the tag measures, on
which step axis, and where its points are missing on purpose.
"""

from __future__ import annotations

import functools
import time
from collections import defaultdict

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


def _compile_series_writer():
    """One compiled loop for every tag of one summary writer (a compiled function
    captures the default writer when traced). tf.summary.write keeps the tag
    verbatim, where tf.summary.scalar would prefix the loop's name scope."""
    import tensorflow as tf

    @tf.function(
        input_signature=[
            tf.TensorSpec([], tf.string),
            tf.TensorSpec([None], tf.int64),
            tf.TensorSpec([None], tf.float32),
            tf.TensorSpec([], tf.string),
        ]
    )
    def write_series(tag, steps, values, serialized_metadata):
        for index in tf.range(tf.shape(steps)[0]):
            tf.summary.write(tag, values[index], step=steps[index], metadata=serialized_metadata)

    return write_series


@functools.lru_cache(maxsize=256)
def _scalar_metadata(tag: str) -> bytes:
    from tensorboard.plugins.scalar import metadata

    return metadata.create_summary_metadata(
        display_name=None, description=tag_description(tag)
    ).SerializeToString()


class ScalarWriter:
    """Buffers scalar points for one TensorBoard run folder and writes them in batches.

    Points are written when ``flush_points`` are buffered, when a point arrives
    ``flush_seconds`` or more after the last write (so TensorBoard follows a live
    run), and on ``flush`` and ``close``.

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
        self._series: dict[str, tuple[list[int], list[float]]] = defaultdict(lambda: ([], []))
        self._buffered = 0
        self._last_write = time.monotonic()
        self._summary_writer = None
        self._write_series = None

    def add(self, step: int, values: dict[str, float | None]) -> None:
        """Adds one point per tag at ``step``; None values are not measured and skipped."""
        for tag, value in values.items():
            if value is not None:
                steps, series = self._series[tag]
                steps.append(int(step))
                series.append(float(value))
                self._buffered += 1
        if (
            self._buffered >= self.flush_points
            or time.monotonic() - self._last_write >= self.flush_seconds
        ):
            self.flush()

    def flush(self) -> None:
        self._last_write = time.monotonic()
        if not self._buffered:
            return
        import numpy as np

        self._ensure_writer()
        with self._summary_writer.as_default():
            for tag, (steps, values) in self._series.items():
                if steps:
                    self._write_series(
                        tag,
                        np.asarray(steps, np.int64),
                        np.asarray(values, np.float32),
                        _scalar_metadata(tag),
                    )
        self._summary_writer.flush()
        self._series.clear()
        self._buffered = 0

    def write_text(self, tag: str, markdown: str, step: int = 0) -> None:
        """Writes a text summary (TensorBoard's Text tab renders markdown) at once."""
        import tensorflow as tf

        self._ensure_writer()
        with self._summary_writer.as_default():
            tf.summary.text(tag, markdown, step=step)
        self._summary_writer.flush()

    def _ensure_writer(self) -> None:
        if self._summary_writer is None:
            import tensorflow as tf

            self._summary_writer = tf.summary.create_file_writer(self.run_dir)
            self._write_series = _compile_series_writer()

    def close(self) -> None:
        self.flush()
        if self._summary_writer is not None:
            self._summary_writer.close()
            self._summary_writer = self._write_series = None
