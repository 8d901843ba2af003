"""Reading records: the JSON Lines files of one or more log dirs into Arrow tables and
pandas frames, typed by ``fields``; damaged lines are skipped with a warning, never a
traceback. Needs no TensorFlow: analysis and tests read records without training."""

from __future__ import annotations

import io
import json
import mmap
import os
import re
import warnings
from collections.abc import Iterable
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from keras_dp_tools.common.warn import warn
from keras_dp_tools.records.fields import COMMON_FIELDS, FIELDS, STEP_FIELDS
from keras_dp_tools.records.writer import LAUNCHER_RECORDS, RECORDS_DIRNAME, SCHEMA_VERSION


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
