"""Reading records: the JSON Lines files of one or more log dirs into Arrow tables and
pandas frames, typed by ``fields``; damaged lines are skipped with a warning, never a
traceback. Needs no TensorFlow: analysis and tests read records without training.

Large files get a columnar copy, ``<records dir>/.cache/<file>.parquet`` (see
``read_records_by_type`` and docs/records.md): reading it is much cheaper than parsing
the JSON Lines again (benchmarks/NOTES.md has the figures)."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import mmap
import os
import re
import stat
import uuid
import warnings
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from keras_dp_tools.common.warn import warn
from keras_dp_tools.records.comparison import comparison_path, find_comparisons
from keras_dp_tools.records.contract import PROFILE_SUBDIR, TRACE_SUFFIX, TRIAL_MARKER
from keras_dp_tools.records.fields import COMMON_FIELDS, FIELDS, STEP_FIELDS
from keras_dp_tools.records.writer import LAUNCHER_RECORDS, RECORDS_DIRNAME, SCHEMA_VERSION


def find_record_files(
    sources: str | os.PathLike | Iterable[str | os.PathLike], trials: bool = False
) -> list[Path]:
    """Record files under one or more log dirs, record folders or ``.jsonl`` paths.

    A log dir is searched recursively, so a folder of many runs (a sweep) yields all
    of them. Raises ``FileNotFoundError`` naming what was searched when none exist.

    Args:
        sources: log dirs, record folders or record files.
        trials: also the records of tuning trials: the candidates' short runs that
            ``compare_strategies`` keeps below its ``strategy_comparison.json``, and any
            run in a folder that a trial process marked (``TRIAL_MARKER``; also
            ``tune_allreduce``'s, and a comparison stopped before its record). They are
            the tuning's evidence, not the user's training, so a search leaves them out
            by default. A records file given by path is always read.

    Returns:
        The ``.jsonl`` files found, in order.

    Raises:
        FileNotFoundError: none was found (the message names what was searched).

    Example:

    ```python
    from keras_dp_tools.records.reader import find_record_files

    print(find_record_files("runs"))  # every run's worker-<i>.jsonl under runs/
    ```
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
                under = sorted(path.glob(f"**/{RECORDS_DIRNAME}/{name}"))
                if path.name == RECORDS_DIRNAME:
                    under += sorted(path.glob(name))
                found.extend(file for file in under if trials or not _trial_run(file, path))
        else:
            raise FileNotFoundError(f"No such file or directory: {path}")
    found = sorted(set(found))
    if not found:
        raise FileNotFoundError(
            f"No keras_dp_tools records found under {', '.join(searched)}. Expected "
            f"'{RECORDS_DIRNAME}/worker-<i>.jsonl' files, written when a model is trained "
            "with kdt.callbacks(log_dir) in fit, or by kdt.TrainingLoop around a custom "
            f"loop's steps (strategy.run).{_nothing_found_hint(searched, trials)}"
        )
    return found


def _nothing_found_hint(searched: list[str], trials: bool) -> str:
    """What else the searched folders hold: a comparison's trial runs left out, or
    profiler captures that ``keras-dp analyze`` reads without records."""
    marked = (
        find_comparisons(place) or any(Path(place).glob(f"**/{TRIAL_MARKER}")) for place in searched
    )
    if not trials and any(marked):
        return (
            " (Tuning trials' runs, such as a strategy comparison's, are left out: "
            "trials=True, or keras-dp report --trials, reads them.)"
        )
    captures = [
        path
        for source in searched
        if Path(source).is_dir()
        for path in Path(source).glob(f"**/{PROFILE_SUBDIR}/*/*{TRACE_SUFFIX}")
    ]
    if captures:
        return (
            f" It holds {len(captures)} profiler capture(s): `keras-dp analyze "
            f"{searched[0]}` (or kdt.analyze_trace) breaks them down without records."
        )
    return ""


def _trial_run(file: Path, root: Path) -> bool:
    """Whether a records file is a tuning trial's: its run folder, or a folder above it up
    to the searched ``root``, holds the trial marker, or a folder above it holds a
    strategy comparison."""
    folder = file.parent.parent if file.parent.name == RECORDS_DIRNAME else file.parent
    while True:
        if (folder / TRIAL_MARKER).is_file():
            return True
        if folder == root or root not in folder.parents:
            return False
        folder = folder.parent
        if comparison_path(folder).is_file():
            return True


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


def _only_records(table: pa.Table, path: Path, required: bool = True) -> pa.Table:
    """Keeps the lines that are records (a string ``type``, ``run`` and ``worker``); a
    file with content and no such line is not ours and raises (unless not ``required``:
    the part of a file after the records read before)."""
    if "type" not in table.column_names:
        ours = pa.array([False] * len(table))
    else:
        ours = pc.is_valid(table.column("type"))
        for name in ("run", "worker"):
            present = name in table.column_names
            ours = pc.and_(ours, pc.is_valid(table.column(name)) if present else False)
    kept = pc.sum(ours).as_py() or 0
    if kept == 0 and required:
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
    170 MB: mapping spares reading them into a copy first), and its modification and
    change times (``_stamp``), taken first: a file that changes while it is read is
    never cached as what was read. A writer may keep appending; the map ends where the
    file ended when it was opened."""
    with open(path, "rb") as file:
        stamp = _stamp(os.fstat(file.fileno()))
        try:
            return mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ), stamp
        except (OSError, ValueError):  # empty, or not a mappable file (a pipe)
            return file.read(), stamp


def _stamp(info: os.stat_result) -> list[int]:
    """What tells a file's versions apart besides its size: the modification time, and
    the change time, which no one can set back (``cp -p``, ``rsync -t`` and coarse
    mtimes give another file of the same size the same mtime)."""
    return [info.st_mtime_ns, info.st_ctime_ns]


@dataclasses.dataclass
class _Parsed:
    """The records of one file as parsed, and what a cache of them is keyed by."""

    table: pa.Table
    messages: list[str]  # the warnings the read gives (damaged lines, a newer schema)
    size: int  # bytes of the file when read (a torn last line included)
    stamp: list[int]  # _stamp: modification and change time
    end: int  # the byte after the last complete line: where a later read continues
    tail: str  # digest of the complete lines' last bytes: the file was appended to


def _parse_file(path: Path, start: int = 0, required: bool = True) -> _Parsed:
    """The records of one file (from byte ``start``, a line's start) as an Arrow table;
    a torn last line is ignored. A file with content but no record raises (unless not
    ``required``). Warnings are returned, not given."""
    data, stamp = _file_bytes(path)
    end = data.rfind(b"\n") + 1  # whatever follows the last newline is a torn line
    tail = hashlib.sha1(data[max(0, end - _TAIL_BYTES) : end]).hexdigest()
    parsed = _Parsed(_SCHEMA.empty_table(), [], len(data), stamp, end, tail)
    if _PRINTABLE.search(data, start, end) is None:  # stops at the first printable byte
        if end == 0 and len(data) > 4096 and required:  # not one line: no records writer
            raise _not_records(path, "it has no line break in its first 4 KiB or more")
        return parsed
    with warnings.catch_warnings(record=True) as damaged:
        warnings.simplefilter("always")
        table = _parse_lines(pa.py_buffer(data).slice(start, end - start), path)
        # A file that is not records raises here, before any of its warnings.
        parsed.table = _only_records(table, path, required)
    parsed.messages = [str(warning.message) for warning in damaged]
    newer = _newer_schema(parsed.table, path)
    if newer is not None:
        parsed.messages.append(newer)
    return parsed


def _read_table(path: Path, start: int = 0) -> pa.Table:
    """``_parse_file``'s table, its warnings given."""
    parsed = _parse_file(path, start)
    _give(parsed.messages)
    return parsed.table


def _give(messages: list[str]) -> None:
    for message in messages:
        warn(message)


def _newer_schema(table: pa.Table, path: Path) -> str | None:
    """The warning when a header of a newer records schema wrote ``table``."""
    if "schema" in table.column_names:
        schema = pc.max(table.column("schema")).as_py()
        if schema is not None and schema > SCHEMA_VERSION:
            return (
                f"{path} was written with records schema {schema}; this version of "
                f"keras_dp_tools reads schema {SCHEMA_VERSION}. Upgrade keras_dp_tools to "
                "read every field."
            )
    return None


def read_records(path: str | os.PathLike) -> pd.DataFrame:
    """Reads one records file into a DataFrame with a column per field.

    A torn last line (the writer crashed, or is writing right now) is ignored.
    Records of all types share the frame; filter on ``type``.

    Args:
        path: the ``.jsonl`` file.

    Returns:
        One row per record, typed by the record fields.

    Example: see ``RecordWriter``'s.
    """
    return _read_table(Path(path)).to_pandas(types_mapper=_PANDAS_TYPES.get)


def read_records_by_type(path: str | os.PathLike, start: int = 0) -> dict[str, pd.DataFrame]:
    """Reads one records file into a DataFrame per record type, each with only the
    fields its records have (splitting in Arrow keeps a million step lines fast):
    ``record_frame`` of each of ``read_record_tables``.

    Args:
        path: the ``.jsonl`` file.
        start: the byte offset of a line to read from (see ``read_record_tables``).

    Returns:
        Record type -> its DataFrame.

    Example:

    ```python
    from keras_dp_tools.records.reader import read_records_by_type

    frames = read_records_by_type("runs/exp1/keras_dp/worker-0.jsonl")
    print(frames["step"][["step", "step_ms"]].describe())
    ```
    """
    return {
        record_type: record_frame(table)
        for record_type, table in read_record_tables(path, start).items()
    }


def record_frame(table: pa.Table) -> pd.DataFrame:
    """A table of ``read_record_tables`` as a DataFrame (integers as ``Int64``, bools
    as ``boolean``: records may leave them empty). The table's buffers are released as
    its columns are converted: it must not be used after.

    Args:
        table: one record type's table.

    Returns:
        The DataFrame, every numpy column writable.
    """
    frame = table.to_pandas(types_mapper=_PANDAS_TYPES.get, split_blocks=True, self_destruct=True)
    return _writable(frame)


def _writable(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with every numpy column writable. Arrow hands numeric columns without
    gaps over without a copy, read-only: a user's edit of a report's frame
    (``report.steps.loc[...] = ...``) then fails with "assignment destination is
    read-only". One column at a time, so the copy adds one column to the peak."""
    for name in frame.columns:
        values = frame[name].to_numpy() if isinstance(frame[name].dtype, np.dtype) else None
        if values is not None and not values.flags.writeable:
            frame[name] = values.copy()
    return frame


def read_record_tables(path: str | os.PathLike, start: int = 0) -> dict[str, pa.Table]:
    """Reads one records file into an Arrow table per record type, each with only the
    fields its records have (``read_records_by_type`` without the conversion: tables of
    many files can be concatenated first).

    A file of ``CACHE_MIN_BYTES`` or more is read from its columnar copy,
    ``records_cache_path(path)``, while that copy matches it (same size and
    modification time); a file that grew since is parsed from where the copy ends and
    the copy updated. A missing, stale or damaged copy is (re)written from the JSON
    Lines; where it cannot be (a read-only log dir), the file is parsed each time.

    Args:
        path: the ``.jsonl`` file.
        start: the byte offset of a line to read from (``Recorder.run_offset``: a run's
            own records, without the runs before it in the file). Reads from an offset
            parse the JSON Lines.

    Returns:
        Record type -> its Arrow table, in the order the types first appear.
    """
    path = Path(path)
    tables = None
    if start == 0 and _cacheable(path):
        tables = _cached_tables(path)
    if tables is None:
        tables = _by_type(_read_table(path, start))
    return tables


def _by_type(table: pa.Table) -> dict[str, pa.Table]:
    """The table's rows per record type (first seen first), each without the columns
    its records leave empty."""
    tables = {}
    types = table.column("type")
    for record_type in pc.unique(types).to_pylist():
        part = table.filter(pc.equal(types, record_type))
        empty = [name for name in part.column_names if part.column(name).null_count == len(part)]
        tables[record_type] = part.drop_columns(empty)
    return tables


# -- the columnar cache ----------------------------------------------------------------

CACHE_DIRNAME = ".cache"
# Files from this size on are cached (~5,000 step records); smaller ones parse in
# milliseconds.
CACHE_MIN_BYTES = 1 << 20
# The cache's own layout; a cache of another layout, records schema or field list is
# rewritten, never read.
CACHE_FORMAT = 1
_CACHE_KEY = b"keras_dp_tools.records_cache"
_FIELDS_DIGEST = hashlib.sha1(repr([(name, str(kind)) for name, kind in FIELDS.items()]).encode())
_TAIL_BYTES = 4096
_cache_warned = False


def records_cache_path(path: str | os.PathLike) -> Path:
    """Where the columnar copy of a records file is kept.

    Args:
        path: the ``.jsonl`` file.

    Returns:
        ``<records dir>/.cache/<file name>.parquet``.

    Example:

    >>> from keras_dp_tools.records.reader import records_cache_path
    >>> records_cache_path("runs/exp1/keras_dp/worker-0.jsonl").as_posix()
    'runs/exp1/keras_dp/.cache/worker-0.jsonl.parquet'
    """
    path = Path(path)
    return path.parent / CACHE_DIRNAME / f"{path.name}.parquet"


def _cacheable(path: Path) -> bool:
    try:
        info = path.stat()
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_size >= CACHE_MIN_BYTES


def _cache_key(parsed: _Parsed) -> dict:
    return {
        "format": CACHE_FORMAT,
        "schema": SCHEMA_VERSION,
        "fields": _FIELDS_DIGEST.hexdigest(),
        "size": parsed.size,
        "stamp": parsed.stamp,
        "end": parsed.end,
        "tail": parsed.tail,
        "messages": parsed.messages,
    }


def _cached_tables(path: Path) -> dict[str, pa.Table]:
    """The file's tables by type through its cache: read while it matches the file,
    extended when the file grew, else parsed and written."""
    cache = records_cache_path(path)
    key, cached = _read_cache(cache)
    info = path.stat()
    if cached is not None and (key["size"], key.get("stamp")) == (info.st_size, _stamp(info)):
        _give(key["messages"])
        return cached
    tables = None
    if cached is not None and info.st_size > key["size"] and _same_tail(path, key):
        # Appended to (a run still writing): parse only the new lines.
        parsed = _parse_file(path, key["end"], required=False)
        try:
            tables = _appended(cached, _by_type(parsed.table))
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # an unknown field changed its type
            tables = None
        messages = list(dict.fromkeys(key["messages"] + parsed.messages))
    if tables is None:
        parsed = _parse_file(path)
        tables, messages = _by_type(parsed.table), parsed.messages
    _give(messages)
    if tables:
        _write_cache(cache, tables, {**_cache_key(parsed), "messages": messages})
    return tables


def _appended(tables: dict[str, pa.Table], more: dict[str, pa.Table]) -> dict[str, pa.Table]:
    combined = dict(tables)
    for record_type, table in more.items():
        if record_type in combined:
            table = pa.concat_tables(
                [combined[record_type], table], promote_options="permissive"
            ).combine_chunks()
        combined[record_type] = table
    return combined


def _same_tail(path: Path, key: dict) -> bool:
    """Whether the file still holds, where the cache ended, the bytes it was made of
    (it grew by appending; it was not replaced by another file)."""
    end = key["end"]
    try:
        with open(path, "rb") as file:
            file.seek(max(0, end - _TAIL_BYTES))
            tail = file.read(min(end, _TAIL_BYTES))
    except OSError:
        return False
    return hashlib.sha1(tail).hexdigest() == key["tail"]


def _read_cache(cache: Path) -> tuple[dict | None, dict[str, pa.Table] | None]:
    """The cache's key and tables by type; (None, None) where there is no usable cache
    (missing, another format or field list, damaged: warned once)."""
    try:
        with open(cache, "rb") as handle:
            file = pq.ParquetFile(handle)
            key = json.loads((file.schema_arrow.metadata or {}).get(_CACHE_KEY, b"null"))
            if not _current(key):
                return None, None
            tables = {}
            for group, (record_type, columns) in enumerate(key["types"].items()):
                tables[record_type] = file.read_row_group(group, columns=columns)
                if tables[record_type].num_rows != key["rows"][group]:
                    raise ValueError(f"row group {group} has {tables[record_type].num_rows} rows")
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError, KeyError, TypeError, IndexError, pa.ArrowException) as error:
        _warn_cache(f"the columnar copy {cache} is damaged ({error}); the records are read "
                    "from their JSON Lines and the copy written anew")  # fmt: skip
        return None, None
    return key, tables


def _current(key) -> bool:
    return (
        isinstance(key, dict)
        and key.get("format") == CACHE_FORMAT
        and key.get("schema") == SCHEMA_VERSION
        and key.get("fields") == _FIELDS_DIGEST.hexdigest()
    )


def _write_cache(cache: Path, tables: dict[str, pa.Table], key: dict) -> None:
    """Writes the tables, one row group per record type, to a temporary file renamed
    over ``cache`` (a reader never sees half a cache); a failure warns once."""
    temporary = cache.with_name(f".{cache.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    try:
        combined = pa.concat_tables(list(tables.values()), promote_options="permissive")
        key = {
            **key,
            "types": {record_type: table.column_names for record_type, table in tables.items()},
            "rows": [table.num_rows for table in tables.values()],
        }
        schema = combined.schema.with_metadata({_CACHE_KEY: json.dumps(key)})
        combined = combined.replace_schema_metadata(schema.metadata)
        cache.parent.mkdir(exist_ok=True)
        with pq.ParquetWriter(temporary, schema) as writer:
            offset = 0
            for rows in key["rows"]:
                writer.write_table(combined.slice(offset, rows), row_group_size=rows)
                offset += rows
        os.replace(temporary, cache)
    except (OSError, pa.ArrowException) as error:
        temporary.unlink(missing_ok=True)
        _warn_cache(f"could not write the columnar copy {cache} ({error}); the records are "
                    "read from their JSON Lines each time")  # fmt: skip


def _warn_cache(message: str) -> None:
    """Warns about the cache once per process: it only ever costs time."""
    global _cache_warned
    if not _cache_warned:
        _cache_warned = True
        warn(f"keras_dp_tools: {message}.")
