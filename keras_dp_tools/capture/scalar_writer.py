"""TensorBoard scalars written in batches, to keep them off the step's critical path.

An eager ``tf.summary.scalar`` costs the training thread a few percent of a short step
per point, and a compiled writing loop costs a trace in every ``fit``. Points are
buffered instead, and written as TensorBoard ``Event`` protos (the format
``tf.summary`` writes) through TensorFlow's record writer: no graph, no tracing, in a
thread of the writer's own (the training thread only appends points to a list).
benchmarks/NOTES.md has the figures.

Tags are grouped by their first path part, which TensorBoard shows as one section
each: ``dp/`` (the headline step time and throughput), ``dp_window/`` (the breakdown of
profiled steps only), ``dp_window_other/`` (its ``other_ms`` split), ``gpu/`` and
``host/``. Every tag's first point carries a
description (TensorBoard shows it on the chart) that says what the tag measures, on
which step axis, and where its points are missing on purpose.
"""

from __future__ import annotations

import collections
import functools
import itertools
import os
import socket
import threading
import time
import weakref

from keras_dp_tools.capture.forking import set_aside

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
    """What TensorBoard shows under a tag's chart.

    Args:
        tag: a scalar tag (``dp/step_time_ms``).

    Returns:
        The tag's own description, else its group's, with the step axis.
    """
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
THREAD_NAME = "keras_dp_scalars"


def _event_file_name(run_dir: str) -> str:
    # TensorBoard reads every file named events.out.tfevents.* in a run folder; the
    # counter keeps two writers of one process and second apart.
    return os.path.join(
        run_dir,
        f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}."
        f"{os.getpid()}.{next(_EVENT_FILE_SERIAL)}.v2",
    )


# Every ScalarWriter of the process, for the fork handler below.
_LIVE_WRITERS: weakref.WeakSet[ScalarWriter] = weakref.WeakSet()


def _file_identity(path: str) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:  # not a local file (gs://...): no descriptor of ours to mind
        return None
    return stat.st_dev, stat.st_ino


def _mute_descriptors_of(identity: tuple[int, int]) -> None:
    """Points this process's descriptors of the file ``identity`` at /dev/null.

    The parent's record writer is a C ``FILE`` stream whose buffer may hold the parent's
    half-written records at the fork; freeing the child's copy, or the C library at a
    normal exit of the child, would write them into the parent's file a second time.
    """
    try:
        descriptors = [int(name) for name in os.listdir("/dev/fd")]
        null = os.open(os.devnull, os.O_WRONLY)
    except OSError:  # no /dev/fd: the copy is at least never freed (set_aside)
        return
    try:
        for descriptor in descriptors:
            try:
                stat = os.fstat(descriptor)
                if (stat.st_dev, stat.st_ino) == identity:
                    os.dup2(null, descriptor, inheritable=False)
            except OSError:  # the listing's own descriptor, closed meanwhile
                continue
    finally:
        os.close(null)


def _forget_parent_in_child() -> None:
    for writer in list(_LIVE_WRITERS):
        writer._forget_parent()


os.register_at_fork(after_in_child=_forget_parent_in_child)


class ScalarWriter:
    """Buffers scalar points for one TensorBoard run folder and writes them in batches,
    in a thread of its own.

    Points are handed to the writing thread when ``flush_points`` values are buffered
    (None values, which are not written, do not count) and when a point arrives
    ``flush_seconds`` or more after the last hand-over (so TensorBoard follows a live
    run); ``flush`` and ``close`` return once every point added is in the file.
    Building the event protos is kept off the training thread. Each point keeps the
    wall time it was added at.

    An error of the writing thread (a full disk, a lost mount) stops the writer, as
    ``Recorder`` stops recording after a disk error: the error is raised once, by the
    next ``add`` that hands points over, ``flush``, ``write_text`` or ``close``
    (``Recorder`` turns it into its one warning), and every point not in the file by
    then, or added later, is dropped. The file keeps the points written before the
    error (TensorBoard reads up to a record the full disk cut short); nothing is
    written after it, also once the disk has room again.

    A process forked from this one (``os.fork``, multiprocessing's fork start method)
    inherits the writer without the parent's points, locks, thread or file (its
    descriptors in the child point at /dev/null, where the C library's buffer of the
    parent's half-written records goes): the parent writes its points, and the
    child's own points, if it adds any, go to an event file of the child's own in the
    same run folder (its name holds the child's pid; TensorBoard shows both files'
    points as one run).

    Args:
        run_dir: the TensorBoard run folder to write event files into.
        flush_points: buffered values (not None) that trigger a write.
        flush_seconds: time since the last write after which a new point is written
            at once.

    Example:

    ```python
    from keras_dp_tools.capture.scalar_writer import ScalarWriter

    writer = ScalarWriter("runs/exp1/keras_dp/worker-0", flush_points=256, flush_seconds=5.0)
    writer.add(1, {"dp/step_time_ms": 12.5, "dp/examples_per_s": 5120.0})
    writer.close()  # every point added is in the event file
    ```
    """

    YIELD_POINTS = 32  # the writing thread lets the training thread run this often

    def __init__(self, run_dir: str, flush_points: int = 512, flush_seconds: float = 5.0):
        self.run_dir = run_dir
        self.flush_points = flush_points
        self.flush_seconds = flush_seconds
        self._file = None  # a tf.io.TFRecordWriter, opened at the first write
        self._file_identity: tuple[int, int] | None = None  # its (device, inode)
        self._reset()
        _LIVE_WRITERS.add(self)

    def _reset(self) -> None:
        """The state of a new writer (and of one inherited by a forked child)."""
        self._points: list[tuple[float, int, dict[str, float | None]]] = []
        self._buffered = 0  # values in ``_points`` that will be written (not None)
        self._last_write = time.monotonic()
        self._file_lock = threading.Lock()  # the writing thread, texts and close
        self._described: set[str] = set()  # tags whose first point (with metadata) is out
        # Batches handed over, oldest first; ``_busy`` while the thread writes one.
        self._batches: collections.deque[list] = collections.deque()
        self._busy = False
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._thread_pid: int | None = None
        self._error: BaseException | None = None  # not raised yet
        self._stopped = False  # by an error: nothing more is written

    def _forget_parent(self) -> None:
        # Runs in a forked child, where only the forking thread exists: the locks may be
        # held by a thread of the parent (waiting for them would hang the child), and the
        # points are the parent's (the parent writes them), and so is the open file. All
        # of it is set aside, not freed (see ``forking``).
        set_aside(dict(vars(self)))
        if self._file is not None and self._file_identity is not None:
            _mute_descriptors_of(self._file_identity)
        self._file = None
        self._reset()

    def add(self, step: int, values: dict[str, float | None]) -> None:
        """Adds one point per tag at ``step``, now; None values are not measured and skipped."""
        self.add_points([(time.time(), int(step), values)])

    def add_points(self, points: list[tuple[float, int, dict[str, float | None]]]) -> None:
        """Adds ``(wall_time, step, {tag: value})`` points, as ``add`` does."""
        self._points.extend(points)
        self._buffered += sum(
            1 for _, _, values in points for value in values.values() if value is not None
        )
        if (
            self._buffered >= self.flush_points
            or time.monotonic() - self._last_write >= self.flush_seconds
        ):
            self._hand_over()

    def _hand_over(self) -> None:
        self._raise_error()
        self._last_write = time.monotonic()
        if not self._buffered:
            self._points = []  # points of None values only: nothing to write
            return
        points, self._points, self._buffered = self._points, [], 0
        if self._stopped:
            return  # dropped, see the class docstring
        with self._changed:
            self._batches.append(points)
            if self._thread_pid != os.getpid():  # not started, or a forked child
                self._thread_pid = os.getpid()
                self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
                self._thread.start()
            self._changed.notify_all()

    def wait(self) -> None:
        """Returns once the points handed to the writing thread are in the file."""
        with self._changed:
            while self._batches or self._busy:
                if self._thread is None or not self._thread.is_alive():
                    break  # gone (interpreter exit): what is left is written below
                self._changed.wait(0.5)
            left = list(self._batches)
            self._batches.clear()
        for points in left:
            self._write(points)
        self._raise_error()

    def flush(self) -> None:
        """Writes every point added so far; returns once they are in the file."""
        self._hand_over()
        self.wait()

    def _run(self) -> None:
        # Not at a lowered priority (unlike the samplers): ``flush`` and ``close`` make
        # the training thread wait for this one, which a busy machine must not starve.
        while True:
            with self._changed:
                while not self._batches:
                    if self._thread is not threading.current_thread():
                        return  # closed, or replaced
                    self._changed.wait()
                points = self._batches.popleft()
                self._busy = True
            try:
                self._write(points)  # an error is raised on the training thread (_stop)
            finally:
                with self._changed:
                    self._busy = False
                    self._changed.notify_all()

    def _stop(self, error: BaseException) -> None:
        """Stops writing after ``error``, which the training thread raises once."""
        with self._changed:
            if not self._stopped:
                self._stopped = True
                self._error = error
            self._batches.clear()  # dropped: a failed write may have torn the file

    def _raise_error(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error

    def _write(self, points: list) -> None:
        with self._file_lock:
            if self._stopped:
                return
            try:
                self._write_events(points)
            except BaseException as error:
                self._stop(error)

    def _write_events(self, points: list) -> None:
        from tensorboard.compat.proto import event_pb2, types_pb2

        self._ensure_file()
        for index, (wall_time, step, values) in enumerate(points, 1):
            measured = [(tag, value) for tag, value in values.items() if value is not None]
            if not measured:
                continue
            event = event_pb2.Event(wall_time=wall_time, step=step)
            for tag, value in measured:
                summary = event.summary.value.add(tag=tag)
                if tag not in self._described:
                    self._described.add(tag)
                    summary.metadata.ParseFromString(_scalar_metadata(tag))
                summary.tensor.dtype = types_pb2.DT_FLOAT
                summary.tensor.tensor_shape.SetInParent()  # a scalar
                summary.tensor.float_val.append(value)
            self._file.write(event.SerializeToString())
            if index % self.YIELD_POINTS == 0:
                time.sleep(0)  # hands the GIL to a training thread that waits for it
        self._file.flush()

    def write_text(self, tag: str, markdown: str, step: int = 0) -> None:
        """Writes a text summary (TensorBoard's Text tab renders markdown) at once."""
        from tensorboard.compat.proto import event_pb2
        from tensorboard.plugins.text.summary_v2 import text_pb

        event = event_pb2.Event(wall_time=time.time(), step=step, summary=text_pb(tag, markdown))
        with self._file_lock:
            if not self._stopped:
                try:
                    self._ensure_file()
                    self._file.write(event.SerializeToString())
                    self._file.flush()
                except BaseException as error:
                    self._stop(error)
        self._raise_error()

    def _ensure_file(self) -> None:
        if self._file is None:
            import tensorflow as tf
            from tensorboard.compat.proto import event_pb2

            tf.io.gfile.makedirs(self.run_dir)
            path = _event_file_name(self.run_dir)
            self._file = tf.io.TFRecordWriter(path)
            self._file_identity = _file_identity(path)  # for a forked child
            version = event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2")
            self._file.write(version.SerializeToString())

    def close(self) -> None:
        try:
            self.flush()
        finally:
            with self._changed:
                thread, self._thread = self._thread, None  # the writing thread ends
                self._changed.notify_all()
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=10)
            with self._file_lock:
                file, self._file = self._file, None
                if file is not None:
                    try:
                        file.close()
                    except BaseException as error:  # raised unless an error was before
                        self._stop(error)
            self._raise_error()
