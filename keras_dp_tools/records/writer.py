"""Writing records: the JSON Lines files under ``<log_dir>/keras_dp/``.

Every worker appends to ``<log_dir>/keras_dp/worker-<i>.jsonl``; each line is one flat
JSON object with a ``type`` plus the ``run`` id and ``worker`` index, so files from many
workers and runs can be concatenated and still mean the same thing (``fields`` lists
them, ``docs/records.md`` explains them).

Standard library only: the training process writes records without loading pandas or
Arrow.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import threading
from collections.abc import Mapping
from pathlib import Path

SCHEMA_VERSION = 1
RECORDS_DIRNAME = "keras_dp"
LAUNCHER_RECORDS = "launcher.jsonl"  # keras-dp launch --log-dir: how each worker ended


def records_dir(log_dir: str | os.PathLike) -> Path:
    """The folder that holds the JSON Lines records of ``log_dir``.

    Args:
        log_dir: the run folder given to the callbacks.

    Returns:
        ``<log_dir>/keras_dp``.

    Example:

    >>> from keras_dp_tools.records.writer import records_dir
    >>> records_dir("runs/exp1").as_posix()
    'runs/exp1/keras_dp'
    """
    return Path(log_dir) / RECORDS_DIRNAME


def worker_records_path(log_dir: str | os.PathLike, worker: int) -> Path:
    """Where worker ``worker`` appends its records under ``log_dir``.

    Args:
        log_dir: the run folder given to the callbacks.
        worker: the worker's index in its job (0 without a multi-worker strategy).

    Returns:
        ``<log_dir>/keras_dp/worker-<worker>.jsonl``.

    Example:

    >>> from keras_dp_tools.records.writer import worker_records_path
    >>> worker_records_path("runs/exp1", 3).as_posix()
    'runs/exp1/keras_dp/worker-3.jsonl'
    """
    return records_dir(log_dir) / f"worker-{int(worker)}.jsonl"


# One encoder for every record (json.dumps builds one per call when given separators).
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def _json_safe(value):
    # NaN and infinities are not JSON: store them as null ("not measured").
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def encode_record(record: Mapping) -> bytes:
    """One record as the JSON line ``RecordWriter`` appends.

    Args:
        record: a flat mapping of JSON-compatible values.

    Returns:
        The line, newline included, NaN and infinities written as null.

    Example:

    >>> from keras_dp_tools.records.writer import encode_record
    >>> encode_record({"type": "step", "step_ms": float("nan")})
    b'{"type":"step","step_ms":null}\\n'
    """
    try:
        text = _ENCODER.encode(record)
    except ValueError:  # NaN or infinity (the encoder refuses them): null instead
        text = _ENCODER.encode({key: _json_safe(value) for key, value in record.items()})
    return (text + "\n").encode()


# How a template writes a value of each type exactly as ``json`` does: floats and ints
# through their ``repr`` (what ``json`` calls), None as a literal that swallows its value,
# booleans as a word given in place of the value.
_PLACEHOLDERS = {float: "%r", int: "%d", type(None): "null%.0s", bool: "%s"}
_JSON_BOOLS = {True: "true", False: "false"}
_PLAIN_VALUES = {float: 0.0, int: 0, type(None): None, bool: "true"}  # no "n" once written


class RecordTemplate:
    """Encodes records of one shape (fixed keys, in order) more cheaply than ``json``.

    A step record is written once per training step, in a hook between two steps,
    where the general JSON encoder is costly (its caches are cold after the step;
    benchmarks/NOTES.md has the figures). The template formats the record with one
    ``%`` from a format string built once per combination of value types; the
    constant fields (``type``, ``run``, ``worker``) and the keys are encoded once, by
    ``json``. ``line`` returns exactly the bytes ``encode_record`` would, or None where
    it does not apply (a value other than a plain float, int, bool or None, or a float
    that is NaN or infinite): then the caller encodes the record the general way.

    Args:
        head: the leading fields, the same in every record (e.g. type, run, worker).
        keys: the names of the varying fields, in the order ``line`` gets their values.

    Example:

    >>> from keras_dp_tools.records.writer import RecordTemplate, encode_record
    >>> template = RecordTemplate({"type": "step", "worker": 0}, ("step", "step_ms"))
    >>> template.line((7, 12.5)) == encode_record({"type": "step", "worker": 0, "step": 7,
    ...                                            "step_ms": 12.5})
    True
    >>> template.line((7, float("nan"))) is None  # the general way, then
    True
    """

    def __init__(self, head: Mapping, keys: tuple[str, ...]):
        self.keys = keys
        # Type combination -> (format, positions of booleans, "n"s outside the values);
        # None for a combination the template does not handle.
        self._formats: dict[tuple[type, ...], tuple[str, tuple[int, ...], int] | None] = {}
        self._head = None  # no template: every line() is None
        if len(set(keys)) == len(keys) and not set(keys) & set(head):
            # A head json refuses leaves no template: the general path says why.
            with contextlib.suppress(TypeError, ValueError):
                self._head = _ENCODER.encode(dict(head))[:-1]  # without the closing brace

    def line(self, values: tuple) -> bytes | None:
        """The record's JSON line (newline included), or None (use ``encode_record``)."""
        kinds = tuple(map(type, values))
        try:
            found = self._formats[kinds]
        except KeyError:
            found = self._formats[kinds] = self._format(kinds)
        if found is None:
            return None
        template, bools, constant_ns = found
        if bools:
            values = list(values)
            for index in bools:
                values[index] = _JSON_BOOLS[values[index]]
            values = tuple(values)
        text = template % values
        # A finite float's repr has no "n"; "nan", "inf" and "-inf" each have one.
        if text.count("n") != constant_ns:
            return None
        return text.encode()

    def _format(self, kinds: tuple[type, ...]) -> tuple[str, tuple[int, ...], int] | None:
        if self._head is None or len(kinds) != len(self.keys):
            return None
        if not all(kind in _PLACEHOLDERS for kind in kinds):
            return None
        fields = ",".join(
            f"{_ENCODER.encode(key).replace('%', '%%')}:{_PLACEHOLDERS[kind]}"
            for key, kind in zip(self.keys, kinds, strict=True)
        )
        comma = "," if fields and self._head != "{" else ""
        template = f"{self._head.replace('%', '%%')}{comma}{fields}}}\n"
        bools = tuple(index for index, kind in enumerate(kinds) if kind is bool)
        # Values without an "n" of their own: the "n"s every line has.
        plain = tuple(_PLAIN_VALUES[kind] for kind in kinds)
        return template, bools, (template % plain).count("n")


class RecordWriter:
    """Appends records to one JSON Lines file, durably and from several threads.

    Each record is written as one line straight to the operating system, so a crash
    of the process (even SIGKILL) loses at most the line being written. A torn last
    line left by an earlier crash is closed off with a newline before appending, so it
    cannot swallow the next record.

    Args:
        path: the ``.jsonl`` file; parent folders are created.

    Example:

    >>> import tempfile
    >>> from keras_dp_tools.records.reader import read_records
    >>> from keras_dp_tools.records.writer import RecordWriter, worker_records_path
    >>> path = worker_records_path(tempfile.mkdtemp(), 0)
    >>> writer = RecordWriter(path)
    >>> writer.write({"type": "step", "run": "r", "worker": 0, "time": 1.0, "step": 5})
    >>> writer.close()
    >>> read_records(path)["step"].tolist()
    [5]
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._file = open(self.path, "a+b")  # noqa: SIM115 - closed by close()
        self._close_torn_line()
        self._fd = self._file.fileno()

    def _close_torn_line(self):
        self._file.seek(0, os.SEEK_END)
        if self._file.tell() == 0:
            return
        self._file.seek(-1, os.SEEK_END)
        if self._file.read(1) != b"\n":
            self._file.write(b"\n")
            self._file.flush()

    def write(self, record: Mapping) -> None:
        """Appends one record (a flat mapping of JSON-compatible values)."""
        self.write_line(encode_record(record))

    def write_line(self, line: bytes) -> None:
        """Appends one encoded record (``encode_record``, ``RecordTemplate.line``)."""
        with self._lock:
            if self._file.closed:
                raise ValueError(f"RecordWriter for {self.path} is closed.")
            # Straight to the kernel (the file is opened for appending): the line
            # survives a SIGKILL of this process, without a Python buffer to flush. A
            # short write (a full disk) is finished or raises.
            written = os.write(self._fd, line)
            while written < len(line):
                written += os.write(self._fd, line[written:])

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.close()

    @property
    def closed(self) -> bool:
        return self._file.closed
