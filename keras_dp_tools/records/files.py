"""Records on disk: the contract between capture and analysis.

Every worker appends JSON Lines to ``<log_dir>/keras_dp/worker-<i>.jsonl``. Each line
is one flat JSON object with a ``type`` plus the ``run`` id and ``worker`` index, so
files from many workers and many runs can be concatenated and still mean the same
thing. The full field list lives in ``docs/records.md``; ``FIELDS`` below is the
machine-readable version the reader uses.

This module imports neither TensorFlow nor Keras: analysis and tests read records
without a training session.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import mmap
import os
import re
import threading
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from keras_dp_tools.common.warn import warn
from keras_dp_tools.records import columns as schema

SCHEMA_VERSION = 1
RECORDS_DIRNAME = "keras_dp"
RECORD_TYPES = (
    "header",
    "step",
    "window",
    "replica_step",
    "step_breakdown",
    "gpu_status",
    "gpu_sample",
    "cpu_sample",
    "batching_finding",
    "scaling_plan",
    "fit_end",  # StepTimer at the end of a fit (status finished) or at exit inside one
    "worker_exit",  # keras-dp launch: how each worker process ended (launcher.jsonl)
)

# Field name -> Arrow type, per record type. Unknown fields (written by a newer
# version) are still read, with their type inferred.
COMMON_FIELDS: dict[str, pa.DataType] = {
    "type": pa.string(),
    "run": pa.string(),
    "worker": pa.int64(),
    "time": pa.float64(),  # Unix seconds (start of the step for steps)
}
HEADER_FIELDS: dict[str, pa.DataType] = {
    "schema": pa.int64(),
    "hostname": pa.string(),
    "pid": pa.int64(),
    "strategy": pa.string(),
    "replicas": pa.int64(),
    "workers": pa.int64(),
    "devices": pa.list_(pa.string()),
    "global_batch": pa.int64(),
    "steps_per_execution": pa.int64(),
    "keras_package": pa.string(),
    "keras_version": pa.string(),
    "tf_version": pa.string(),
    "python_version": pa.string(),
    "keras_dp_tools_version": pa.string(),
    "embedding_layers": pa.int64(),
    "embedding_names": pa.list_(pa.string()),  # "<layer> (<vocabulary>x<dim>)"
}
STEP_FIELDS: dict[str, pa.DataType] = {  # one record per executed train function call
    "epoch": pa.int64(),
    "step": pa.int64(),  # optimizer.iterations before the call: the first step covered
    "steps": pa.int64(),  # steps covered by the record (steps_per_execution)
    "step_ms": pa.float64(),  # host wall time per step (call time / steps)
    "examples_per_s": pa.float64(),
    "warmup": pa.bool_(),  # first call of a fit: includes tracing and compilation
}
# Profiler windows and the per-step breakdown (see keras_dp_tools.analysis.breakdown.api).
WINDOW_FIELDS: dict[str, pa.DataType] = {
    "window": pa.int64(),  # index of the window within the callback's life; null if skipped
    "start_step": pa.int64(),
    "end_step": pa.int64(),  # first step after the window
    # window: open, analysed, skipped, failed, foreign (another profiler); fit_end:
    # finished, exited
    "status": pa.string(),
    "reason": pa.string(),
    "steps_analysed": pa.int64(),
    "stop_ms": pa.float64(),  # training-thread time spent stopping the profiler
    "analysis_end": pa.float64(),  # Unix seconds when the background analysis ended
    "trace": pa.string(),  # the .xplane.pb, relative to the log dir
    "profile_run": pa.string(),  # the capture's name in TensorBoard's Profile tab
    "attribution": pa.string(),  # null: replicas read off the trace; else why not
    "sparse_bytes": pa.int64(),  # embedding tables: all-gathered, not all-reduced
    # The run's facts the window was analysed with (keras_dp_tools.records.facts); its
    # devices, global_batch and steps_per_execution are the header's fields.
    "local_replicas": pa.int64(),  # this worker's replicas: the devices in its trace
    "replicas_in_sync": pa.int64(),  # ranks of each collective over all workers
    "steps_covered": pa.list_(pa.list_(pa.int64())),  # [first step, steps] per call
    "exit_code": pa.int64(),  # worker_exit: the process's status (negative: killed by signal)
}
# replica_step and step_breakdown records: the columns of keras_dp_tools.records.columns.
_ARROW_TYPES = {int: pa.int64(), float: pa.float64(), str: pa.string()}
BREAKDOWN_FIELDS: dict[str, pa.DataType] = {
    name: _ARROW_TYPES[kind] for name, kind in schema.BREAKDOWN_FIELDS.items()
}
# GpuMonitor (see keras_dp_tools.capture.monitor.nvml_reader for what the readings mean).
MONITOR_FIELDS: dict[str, pa.DataType] = {
    "gpu_available": pa.bool_(),  # gpu_status: whether GPU readings follow
    "gpu_reason": pa.string(),  # gpu_status: why not
    "gpu_names": pa.list_(pa.string()),
    "gpu_pci_bus_ids": pa.list_(pa.string()),
    "gpu": pa.int64(),  # gpu_sample: index among the strategy's GPUs (TF ordinal order)
    "sampling": pa.string(),  # "poll" (all fields) or "buffer" (driver's util buffer)
    **dict.fromkeys(schema.READING_FIELDS, pa.float64()),  # gpu_sample readings
    "process_cpu_percent": pa.float64(),  # cpu_sample: 100 = one core
    "system_cpu_percent": pa.float64(),
    "cpu_count": pa.int64(),
}
# BatchScalingCheck: findings of kdt.check_batching and the run's kdt.ScalingPlan.
SCALING_FIELDS: dict[str, pa.DataType] = {
    "severity": pa.string(),
    "code": pa.string(),
    "message": pa.string(),
    "fix": pa.string(),
    "plan_rule": pa.string(),
    "plan_replicas": pa.int64(),
    "plan_per_replica_batch": pa.int64(),
    "plan_global_batch": pa.int64(),
    "plan_base_batch": pa.int64(),
    "plan_base_lr": pa.float64(),
    "plan_target_lr": pa.float64(),
    "plan_warmup_steps": pa.int64(),
    "plan_explanation": pa.string(),
}
FIELDS = {
    **COMMON_FIELDS,
    **HEADER_FIELDS,
    **STEP_FIELDS,
    **WINDOW_FIELDS,
    **BREAKDOWN_FIELDS,
    **MONITOR_FIELDS,
    **SCALING_FIELDS,
}


LAUNCHER_RECORDS = "launcher.jsonl"  # keras-dp launch --log-dir: how each worker ended


def records_dir(log_dir: str | os.PathLike) -> Path:
    """The folder that holds the JSON Lines records of ``log_dir``."""
    return Path(log_dir) / RECORDS_DIRNAME


def worker_records_path(log_dir: str | os.PathLike, worker: int) -> Path:
    """Where worker ``worker`` appends its records under ``log_dir``."""
    return records_dir(log_dir) / f"worker-{int(worker)}.jsonl"


# One encoder for every record (json.dumps builds one per call when given separators).
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def _json_safe(value):
    # NaN and infinities are not JSON: store them as null ("not measured").
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def encode_record(record: Mapping) -> bytes:
    """One record as the JSON line ``RecordWriter`` appends (NaN and infinities as null)."""
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
    """Encodes records of one shape (fixed keys, in order) ~2x cheaper than ``json``.

    A step record is written once per training step, in a hook between two steps,
    where the general JSON encoder costs ~60 µs of CPU (caches cold after the step).
    The template formats the record with one ``%`` from a format string built once per
    combination of value types; the constant fields (``type``, ``run``, ``worker``) and
    the keys are encoded once, by ``json``. ``line`` returns exactly the bytes
    ``encode_record`` would, or None where it does not apply (a value other than a
    plain float, int, bool or None, or a float that is NaN or infinite): then the
    caller encodes the record the general way.

    Args:
        head: the leading fields, the same in every record (e.g. type, run, worker).
        keys: the names of the varying fields, in the order ``line`` gets their values.
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


def find_record_files(sources: str | os.PathLike | Iterable[str | os.PathLike]) -> list[Path]:
    """Record files under one or more log dirs, record folders or ``.jsonl`` paths.

    A log dir is searched recursively, so a folder of many runs (a sweep) yields all
    of them. Raises ``FileNotFoundError`` naming what was searched when none exist.
    """
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    found: list[Path] = []
    searched = []
    for source in sources:
        path = Path(source)
        searched.append(str(path))
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            for name in ("worker-*.jsonl", LAUNCHER_RECORDS):
                found.extend(sorted(path.glob(f"**/{RECORDS_DIRNAME}/{name}")))
                if path.name == RECORDS_DIRNAME:
                    found.extend(sorted(path.glob(name)))
        else:
            raise FileNotFoundError(f"No such file or directory: {path}")
    found = sorted(set(found))
    if not found:
        raise FileNotFoundError(
            f"No keras_dp_tools records found under {', '.join(searched)}. Expected "
            f"'{RECORDS_DIRNAME}/worker-<i>.jsonl' files, written when a model is trained "
            "with kdt.callbacks(log_dir)."
        )
    return found


_SCHEMA = pa.schema(FIELDS.items())
_PRINTABLE = re.compile(rb"\S")
# Fields of the rare record types (headers, windows, breakdowns) are type-inferred and
# cast afterwards: declaring them up front makes Arrow materialise a null for every step
# line, doubling the parse time.
_DENSE_SCHEMA = pa.schema({**COMMON_FIELDS, **STEP_FIELDS}.items())
# Nullable pandas dtypes keep integer and boolean columns exact when another record
# type leaves them empty (a header has no ``step``).
_PANDAS_TYPES = {pa.int64(): pd.Int64Dtype(), pa.bool_(): pd.BooleanDtype()}


def _parse_lines(data: pa.Buffer, path: Path) -> pa.Table:
    options = pa_json.ParseOptions(explicit_schema=_DENSE_SCHEMA)
    try:
        return _conform(pa_json.read_json(pa.BufferReader(data), parse_options=options), path)
    except pa.ArrowInvalid as error:
        arrow_error = error
    # Slow path, only for damaged files: keep every line that parses on its own.
    lines = data.to_pybytes().splitlines()
    good = [line for line in lines if _is_json(line)]
    if len(good) == len(lines):
        raise _wrong_types(path, arrow_error)
    warn(f"{path}: skipped {len(lines) - len(good)} damaged line(s) that are not valid JSON.")
    if not good:
        return _SCHEMA.empty_table()
    try:
        table = pa_json.read_json(io.BytesIO(b"\n".join(good) + b"\n"), parse_options=options)
    except pa.ArrowInvalid as error:
        raise _wrong_types(path, error) from None
    return _conform(table, path)


def _conform(table: pa.Table, path: Path) -> pa.Table:
    """Gives every known field present in the file its declared type. Absent fields
    stay absent (a file without profiler records has no breakdown columns): adding
    them as nulls would cost a column per field for every line."""
    for name, kind in FIELDS.items():
        index = table.schema.get_field_index(name)
        if index >= 0 and table.schema.field(index).type != kind:
            try:
                table = table.set_column(index, name, table.column(index).cast(kind))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
                raise _wrong_types(path, error) from None
    return table


def _only_records(table: pa.Table, path: Path) -> pa.Table:
    """Keeps the lines that are records (a string ``type``, ``run`` and ``worker``); a
    file with content and no such line is not ours and raises."""
    if "type" not in table.column_names:
        ours = pa.array([False] * len(table))
    else:
        ours = pc.is_valid(table.column("type"))
        for name in ("run", "worker"):
            present = name in table.column_names
            ours = pc.and_(ours, pc.is_valid(table.column(name)) if present else False)
    kept = pc.sum(ours).as_py() or 0
    if kept == 0:
        raise _not_records(
            path, f"none of its {len(table)} JSON line(s) has a type, run and worker"
        )
    if kept < len(table):
        warn(f"{path}: skipped {len(table) - kept} line(s) without a type, run and worker.")
        table = table.filter(ours)
    return table


def _not_records(path: Path, why: str) -> ValueError:
    return ValueError(
        f"{path} is not keras_dp_tools records: {why}. Records are JSON Lines written by "
        "kdt.callbacks(log_dir) into <log_dir>/keras_dp/worker-<i>.jsonl; give Report.load "
        "that log dir or file."
    )


def _wrong_types(path: Path, error: Exception) -> ValueError:
    return ValueError(
        f"{path} holds records whose fields have the wrong types ({error}). "
        "It was not written by keras_dp_tools, or was edited by hand."
    )


def _is_json(line: bytes) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


def _file_bytes(path: Path):
    """The file's content, memory-mapped where the system allows (a million steps are
    170 MB: mapping spares reading them into a copy first); a writer may keep
    appending, the map ends where the file ended when it was opened."""
    with open(path, "rb") as file:
        try:
            return mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError):  # empty, or not a mappable file (a pipe)
            return file.read()


def _read_table(path: Path, start: int = 0) -> pa.Table:
    """The records of one file (from byte ``start``, a line's start) as an Arrow table;
    a torn last line is ignored, and a header of a newer schema warns. A file with
    content but no record raises."""
    data = _file_bytes(path)
    end = data.rfind(b"\n") + 1  # whatever follows the last newline is a torn line
    if _PRINTABLE.search(data, start, end) is None:  # stops at the first printable byte
        if end == 0 and len(data) > 4096:  # not one line: no records writer wrote this
            raise _not_records(path, "it has no line break in its first 4 KiB or more")
        return _SCHEMA.empty_table()
    with warnings.catch_warnings(record=True) as damaged:
        warnings.simplefilter("always")
        table = _parse_lines(pa.py_buffer(data).slice(start, end - start), path)
    table = _only_records(table, path)
    for warning in damaged:  # only now: a file that is not records raises instead
        warn(str(warning.message), warning.category)
    return _check_schema(table, path)


def _check_schema(table: pa.Table, path: Path) -> pa.Table:
    """Warns when a header of a newer records schema wrote ``table``."""
    if "schema" in table.column_names:
        schema = pc.max(table.column("schema")).as_py()
        if schema is not None and schema > SCHEMA_VERSION:
            warn(
                f"{path} was written with records schema {schema}; this version of "
                f"keras_dp_tools reads schema {SCHEMA_VERSION}. Upgrade keras_dp_tools to "
                "read every field."
            )
    return table


def read_records(path: str | os.PathLike) -> pd.DataFrame:
    """Reads one records file into a DataFrame with a column per field.

    A torn last line (the writer crashed, or is writing right now) is ignored.
    Records of all types share the frame; filter on ``type``.
    """
    return _read_table(Path(path)).to_pandas(types_mapper=_PANDAS_TYPES.get)


def read_records_by_type(path: str | os.PathLike, start: int = 0) -> dict[str, pd.DataFrame]:
    """Reads one records file into a DataFrame per record type, each with only the
    fields its records have (splitting in Arrow keeps a million step lines fast).

    Args:
        path: the ``.jsonl`` file.
        start: the byte offset of a line to read from (``Recorder.run_offset``: a run's
            own records, without the runs before it in the file).
    """
    table = _read_table(Path(path), start)
    frames = {}
    types = table.column("type")
    for record_type in pc.unique(types).to_pylist():
        part = table.filter(pc.equal(types, record_type))
        empty = [name for name in part.column_names if part.column(name).null_count == len(part)]
        frames[record_type] = part.drop_columns(empty).to_pandas(types_mapper=_PANDAS_TYPES.get)
    return frames
