"""Shared output of our callbacks: one records file and one TensorBoard run per worker.

Several callbacks (step timer, profiler, GPU monitor) record into the same log dir
during one ``fit``. They share a ``Recorder`` per (log dir, worker) in the process,
so the records file has one writer and one header per run, and the TensorBoard
scalars of all callbacks land in one run folder, ``<log_dir>/keras_dp/worker-<i>``.

Every record reaches the operating system before the hook that wrote it returns, so
a process killed outright (SIGKILL, the OOM killer) keeps every step it recorded
(one ``os.write`` per record; see ``RecordWriter`` and ``write_values``). For steps
so short that this matters, ``KERAS_DP_FLUSH_SECONDS=<s>`` lets per-step records
(``BUFFERED_RECORDS``) wait in memory and a background thread write them in batches:
every ``<s>`` seconds, also while training hangs; at every epoch end; before any
other record (headers, windows, the end of a fit are written at once); at the end of
``fit``; and at exit, also after an exception or Ctrl-C. A process killed outright
then loses at most the per-step records of its last ``<s>`` seconds.
"""

from __future__ import annotations

import atexit
import collections
import logging
import os
import threading
import time
import warnings
from pathlib import Path
from typing import ClassVar

from keras_dp_tools.capture.base import MeasurementWarning
from keras_dp_tools.capture.forking import set_aside
from keras_dp_tools.capture.job_identity import (
    GIVEN_SOURCES,
    JobId,
    environment_job_id,
    job_id_for,
    next_run_id,
)
from keras_dp_tools.capture.scalar_writer import ScalarWriter
from keras_dp_tools.records.contract import FLUSH_SECONDS_ENV
from keras_dp_tools.records.writer import (
    SCHEMA_VERSION,
    RecordTemplate,
    RecordWriter,
    records_dir,
    worker_records_path,
)

logger = logging.getLogger("keras_dp_tools")

# Header fields whose change between two fits of one process starts a new run.
_RUN_IDENTITY = (
    "strategy",
    "replicas",
    "workers",
    "devices",
    "global_batch",
    "steps_per_execution",
    "keras_package",
)


# Records written once per step or sample: buffered (see the module docstring).
BUFFERED_RECORDS = frozenset({"step", "cpu_sample", "gpu_sample"})
FLUSH_SECONDS = 0.0  # nothing waits: a kill loses no step (opt in to batches)
FLUSH_RECORDS = 1024  # at most this many records wait in memory


def flush_seconds(environ=os.environ) -> float:
    """Seconds per-step records may wait in memory: ``KERAS_DP_FLUSH_SECONDS`` or 0."""
    value = environ.get(FLUSH_SECONDS_ENV)
    if value is None or not value.strip():
        return FLUSH_SECONDS
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= 3600:
        raise ValueError(
            f"{FLUSH_SECONDS_ENV} must be a number of seconds from 0 to 3600, received "
            f"{value!r}. Unset it (or 0) to write every record at once, the default."
        )
    return seconds


class Recorder:
    """Records file, run header and TensorBoard writer of one worker in one log dir.

    Obtain it with ``Recorder.acquire(log_dir, worker)`` and give it back with
    ``release()``; the last release closes the files. The recorder itself stays
    known to the process, so a later ``fit`` on the same log dir continues its run.
    """

    _known: ClassVar[dict[tuple[Path, int], Recorder]] = {}
    _registry_lock = threading.Lock()
    _explained_keras3_multiworker = False

    def __init__(self, log_dir: Path, worker: int):
        self.log_dir = log_dir
        self.worker = worker
        self.run_id: str | None = None
        self.run_offset = 0  # the byte where the current run's lines begin
        self._runs_started = 0  # runs this recorder began: numbers the later ones' ids
        self._skip_warned = False  # a record that could not be written was reported
        self._header: dict | None = None
        self._users = 0
        self._records: RecordWriter | None = None
        self._scalars: ScalarWriter | None = None
        self.write_error: Exception | None = None  # set once writing failed: recording stopped
        self.flush_seconds = flush_seconds()
        # Buffered per-step records, oldest first. A deque: appends and pops need no
        # lock (a lock or Thread.is_alive() per record cost ~10 µs each here).
        self._pending: collections.deque[dict] = collections.deque()
        # Held while records go to disk (training thread, GPU sampler, flusher): what
        # was buffered first is written first.
        self._file_lock = threading.Lock()
        self._last_flush = time.monotonic()
        # Per record type: the template of the current run's records (write_values).
        self._templates: dict[str, RecordTemplate] = {}

    @classmethod
    def acquire(cls, log_dir: str | os.PathLike, worker: int) -> Recorder:
        key = (Path(log_dir).resolve(), int(worker))
        with cls._registry_lock:
            recorder = cls._known.get(key)
            if recorder is None:
                recorder = cls(*key)
            if recorder._users == 0:
                recorder._records = RecordWriter(worker_records_path(*key))
                recorder.write_error = None  # a new fit tries again (the disk may have room)
                recorder.flush_seconds = flush_seconds()
            cls._known[key] = recorder
            recorder._users += 1
            return recorder

    @classmethod
    def for_fit(
        cls, log_dir: str | os.PathLike, model, global_batch: int | None = None
    ) -> Recorder:
        """Acquires the recorder of the worker that trains ``model`` and starts (or
        continues) its run: what every callback does in ``on_train_begin``."""
        from keras_dp_tools.capture.run_info import (
            describe_run,
            keras3_multiworker_problem,
            worker_index,
        )

        problem = keras3_multiworker_problem(model)
        if problem is not None and not cls._explained_keras3_multiworker:
            cls._explained_keras3_multiworker = True  # once per process, not per callback
            warnings.warn(problem, UserWarning, stacklevel=4)
        worker, workers = worker_index(model.distribute_strategy)
        recorder = cls.acquire(log_dir, worker)
        try:
            header = describe_run(model, global_batch)
            recorder.start_run(header, job_id_for(model.distribute_strategy, workers))
        except BaseException:
            recorder.release()
            raise
        return recorder

    @property
    def records_path(self) -> Path:
        """The records file this worker appends to."""
        return worker_records_path(self.log_dir, self.worker)

    def release(self) -> None:
        with self._registry_lock:
            self._users -= 1
            if self._users > 0:
                return
            scalars, self._scalars = self._scalars, None
            with self._file_lock:  # the flusher must not write to a closed file
                self._write_pending_locked()
                if self._records is not None:  # None: inherited by a forked child
                    self._close_quietly(self._records.close)
            if scalars is not None:
                self._close_quietly(scalars.close)

    def _close_quietly(self, close) -> None:
        try:
            close()
        except Exception as error:  # buffered bytes the full disk still refuses
            self._stop_recording(error)

    def start_run(self, header: dict, job: JobId | None = None) -> str:
        """Writes a header unless the current run already has the same identity.

        Two fits in a row on the same model continue one run; a fit with another
        strategy, replica count or batch starts a new one. Callbacks of one fit share
        the run: a field one of them does not know (None, e.g. the global batch) does
        not start a new run, and one it adds is recorded by repeating the header.
        ``job`` says where a new run's id comes from (``job_identity.job_id_for``; by
        default ``KERAS_DP_RUN_ID`` or a fresh id) and adds how to the header.
        """
        if self._header is not None:
            known = {key: header.get(key) for key in _RUN_IDENTITY}
            current = {key: self._header.get(key) for key in _RUN_IDENTITY}
            if all(v is None or current[k] in (None, v) for k, v in known.items()):
                additions = {
                    k: v for k, v in header.items() if v is not None and self._header.get(k) is None
                }
                if additions:
                    self._header = {**self._header, **additions}
                    self._append(self._header)  # readers keep a run's last header
                return self.run_id
        job = job or environment_job_id()
        self.run_id = next_run_id(job, self._runs_started, previous=self.run_id)
        self._runs_started += 1
        self._templates = {}  # their head holds the run id
        # Where this run's lines begin, for readers of this run alone (RunAdvisor). A
        # run id given by a launcher or scheduler may have begun in an earlier process
        # (a restart): then from the start.
        given = job.source in GIVEN_SOURCES and self.run_id == job.job_id
        self.run_offset = 0 if given else self._records_end()
        self._header = {
            "type": "header",
            "schema": SCHEMA_VERSION,
            "run": self.run_id,
            "worker": self.worker,
            "time": time.time(),
            **header,
            **job.header_fields(),
        }
        self._append(self._header)
        return self.run_id

    def _records_end(self) -> int:
        """The records file's size once buffered records are written (0 if none)."""
        self._write_pending()
        try:
            return os.stat(self.records_path).st_size
        except OSError:
            return 0

    def write(self, record_type: str, **fields) -> None:
        """Appends one record of ``record_type`` to the current run (per-step records
        within ``flush_seconds``, others at once)."""
        if self.run_id is None:
            raise RuntimeError("Recorder.start_run() must be called before write().")
        self._append({"type": record_type, "run": self.run_id, "worker": self.worker, **fields})

    def write_values(self, record_type: str, keys: tuple[str, ...], values: tuple) -> None:
        """Appends the record ``write(record_type, **dict(zip(keys, values)))`` would,
        formatted by a ``RecordTemplate`` (~2x cheaper than ``json``): for records
        written every step. Give the same ``keys`` object every time."""
        template = self._templates.get(record_type)
        if template is None or template.keys is not keys:
            if self.run_id is None:
                raise RuntimeError("Recorder.start_run() must be called before write_values().")
            head = {"type": record_type, "run": self.run_id, "worker": self.worker}
            template = self._templates[record_type] = RecordTemplate(head, keys)
        try:
            line = None if self.flush_seconds > 0 else template.line(values)
        except (TypeError, ValueError):  # e.g. an int too long to print: json's path warns
            line = None
        if line is None:  # buffered, or a value only json writes (or refuses)
            self.write(record_type, **dict(zip(keys, values, strict=True)))
            return
        # ``_write_records``'s rules for one line, inline: a call costs 5-10 µs of the
        # training thread right after a step.
        with self._file_lock:
            if self._pending:
                self._write_pending_locked()
            if self.write_error is None and self._records is not None:
                try:
                    self._records.write_line(line)
                except ValueError as error:  # written after release (a closed file)
                    self._skip_record({"type": record_type}, error)
                except OSError as error:
                    self._stop_recording(error)

    def _append(self, record: dict) -> None:
        if record["type"] in BUFFERED_RECORDS and self.flush_seconds > 0:
            self._pending.append(record)
            if _Flusher.pid != os.getpid():  # not started, or this is a forked child
                _Flusher.start()
            # The flusher writes them; the training thread only if it falls behind.
            if len(self._pending) >= FLUSH_RECORDS or self._overdue(2 * self.flush_seconds):
                self._write_pending()
            return
        with self._file_lock:
            self._write_pending_locked()
            self._write_records([record])

    def _overdue(self, seconds: float) -> bool:
        return bool(self._pending) and time.monotonic() - self._last_flush >= seconds

    def _write_pending(self) -> None:
        with self._file_lock:
            self._write_pending_locked()

    def _write_pending_locked(self) -> None:
        self._last_flush = time.monotonic()
        pending = self._pending
        records = [pending.popleft() for _ in range(len(pending))]  # more may arrive
        if records:
            self._write_records(records)

    def _write_records(self, records: list[dict]) -> None:
        # A full disk (or a lost mount) stops the recording, never the training: one
        # warning for all callbacks sharing this recorder, then writes are dropped.
        if self.write_error is not None or self._records is None:
            return
        try:
            for record in records:
                try:
                    self._records.write(record)
                except (TypeError, ValueError) as error:  # a value JSON cannot hold
                    self._skip_record(record, error)
        except OSError as error:
            self._stop_recording(error)

    def _skip_record(self, record: dict, error: Exception) -> None:
        """Drops one record that cannot be written (the others still are); warns once."""
        if not self._skip_warned:
            self._skip_warned = True
            warnings.warn(
                f"keras_dp_tools could not write a {record.get('type')!r} record: {error}. "
                "Training and the other records continue; please report this.",
                MeasurementWarning,
                stacklevel=5,
            )

    def _stop_recording(self, error: Exception) -> None:
        if self.write_error is None:
            self.write_error = error
            warnings.warn(
                f"keras_dp_tools stopped recording to {self._records.path}: {error}. "
                "Training continues; records up to here are kept. Free space (or choose "
                "another log_dir) to record the next run.",
                MeasurementWarning,
                stacklevel=5,
            )

    def _summaries(self, write) -> None:
        """Runs ``write(scalar_writer)``; a failure (a full disk, TensorFlow's
        "Could not initialize events writer") stops the recording like a failed record."""
        if self.write_error is not None:  # the disk that refused records refuses events too
            return
        try:
            if self._scalars is None:
                self._scalars = ScalarWriter(
                    str(records_dir(self.log_dir) / f"worker-{self.worker}")
                )
            write(self._scalars)
        except Exception as error:  # TensorFlow raises its own OpError, not OSError
            self._stop_recording(error)

    def scalars(self, step: int, values: dict[str, float | None]) -> None:
        """Adds TensorBoard scalars (tags as given, e.g. ``dp/step_ms``) at ``step``;
        they are written in batches (see ``ScalarWriter``)."""
        self._summaries(lambda writer: writer.add(step, values))

    def scalar_points(self, points: list[tuple[float, int, dict[str, float | None]]]) -> None:
        """Adds ``(wall_time, step, {tag: value})`` points at once (``scalars`` for many)."""
        self._summaries(lambda writer: writer.add_points(points))

    def text(self, tag: str, markdown: str, step: int = 0) -> None:
        """Writes markdown to TensorBoard's Text tab at once."""
        self._summaries(lambda writer: writer.write_text(tag, markdown, step))

    def flush(self) -> None:
        """Writes buffered records and TensorBoard scalars."""
        self._write_pending()
        if self._scalars is not None:
            self._summaries(ScalarWriter.flush)

    @classmethod
    def flush_all(cls) -> None:
        """Flushes every recorder of the process; runs at exit, as a fit that raised
        never reached ``on_train_end``."""
        for recorder in list(cls._known.values()):
            try:
                recorder.flush()
            except Exception as error:  # at exit, TensorFlow may be half torn down
                logger.debug("flushing %s at exit failed: %s", recorder.log_dir, error)


class _Flusher:
    """One daemon thread that writes every recorder's buffered records once they
    waited ``flush_seconds``, off the training thread and also while training hangs."""

    TICK_SECONDS = 0.1
    pid: int | None = None  # the process the thread runs in
    _lock = threading.Lock()

    @classmethod
    def start(cls) -> None:
        with cls._lock:
            if cls.pid != os.getpid():
                threading.Thread(target=cls._run, name="keras_dp_records", daemon=True).start()
                cls.pid = os.getpid()

    @classmethod
    def _run(cls) -> None:
        from keras_dp_tools.capture.monitor.background import lower_thread_priority

        lower_thread_priority()
        while True:
            time.sleep(cls.TICK_SECONDS)
            for recorder in list(Recorder._known.values()):
                try:
                    if recorder._overdue(recorder.flush_seconds):
                        recorder._write_pending()
                except Exception as error:  # e.g. a file closed meanwhile: next fit's
                    logger.debug("writing buffered records failed: %s", error)


atexit.register(Recorder.flush_all)


class ForkedChildError(RuntimeError):
    """What a recorder inherited by a forked child says instead of writing."""


_FORKED = ForkedChildError("this process was forked from the one that owns the recorder")


def _forget_parent_in_child() -> None:
    """A child forked from a training process (``os.fork``, multiprocessing's fork start
    method) inherits its recorders: their buffered records are the parent's to write,
    a thread of the parent may hold their locks, and their files are the parent's. The
    child forgets them, so that its exit neither writes the parent's records a second
    time nor hangs; an inherited recorder writes nothing more, and a fit in the child
    gets recorders of its own."""
    # What the recorders held is set aside, not freed (see ``forking``): e.g. an old
    # write error whose traceback holds TensorFlow objects crashed the child when freed.
    set_aside(Recorder._known)
    for recorder in Recorder._known.values():
        set_aside(dict(vars(recorder)))
        recorder._pending = collections.deque()
        recorder._file_lock = threading.Lock()
        recorder._records = None  # its lock may be held by a thread of the parent
        recorder.write_error = _FORKED
    Recorder._known = {}
    Recorder._registry_lock = threading.Lock()
    _Flusher.pid, _Flusher._lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_parent_in_child)
