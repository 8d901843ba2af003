"""Records files -> one frame per record type (``records_by_type``), and a type's
records with given columns (``of_type``): the first step of loading a run
(``analysis.run_frames.load_run_frames``).

Pure functions over the files' Arrow tables; no TensorFlow.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from keras_dp_tools.records.reader import read_record_tables, record_frame


def records_by_type(files: Iterable[tuple[str | os.PathLike, int]]) -> dict[str, pd.DataFrame]:
    """The records of the files, one frame per record type.

    Each row but the steps' carries the ``source`` file it came from (no frame shows a
    step's source: it would be one copy per step).

    Args:
        files: ``(path, byte offset)`` pairs: each file is read from its offset (the
            first line of a run, ``Recorder.run_offset``).

    Returns:
        A dict of record type -> DataFrame.

    Example:

    ```python
    from keras_dp_tools.analysis.record_tables import records_by_type

    records = records_by_type([("runs/demo/keras_dp/worker-0.jsonl", 0)])
    print(sorted(records))
    ```
    """
    by_type: dict[str, list[tuple[str, pa.Table]]] = {}
    for path, start in files:
        for record_type, table in read_record_tables(path, start).items():
            by_type.setdefault(record_type, []).append((str(path), table))
    # Each type's tables are let go once converted (the steps' are most of the memory).
    return {
        record_type: _records_frame(record_type, by_type.pop(record_type))
        for record_type in list(by_type)
    }


def _records_frame(record_type: str, parts: list[tuple[str, pa.Table]]) -> pd.DataFrame:
    """One record type's tables of several files as one frame."""
    tables = [table for _, table in parts]
    if record_type == "step" and all(table.schema == tables[0].schema for table in tables):
        # One conversion of the tables joined in Arrow (no copy there): converting each
        # and concatenating the frames held every step twice.
        joined = pa.concat_tables(_by_worker(tables))
        parts.clear()
        del tables
        return record_frame(joined)
    frames = []
    for path, table in parts:
        frame = record_frame(table)
        frames.append(frame if record_type == "step" else frame.assign(source=path))
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]


def _by_worker(tables: list[pa.Table]) -> list[pa.Table]:
    """The step tables by worker number where each holds one worker's steps, another
    worker's than the rest (files come as worker-0, worker-1, worker-10, ...): joined
    in that order, the steps are sorted already, and ``timed_steps`` does not reorder
    the steps. Else as they are. (No two tables share a worker, so their order
    does not change what the stable sort by run, worker and step gives.)"""
    workers = []
    for table in tables:
        if "worker" not in table.column_names:
            return tables
        column = table.column("worker")
        if not pa.types.is_integer(column.type) or len(column) == 0 or column.null_count:
            return tables
        low, high = pc.min_max(column).values()
        if low != high:
            return tables
        workers.append(low.as_py())
    if len(set(workers)) < len(workers):
        return tables
    order = sorted(range(len(tables)), key=workers.__getitem__)
    return [tables[index] for index in order]


def of_type(records: Mapping[str, pd.DataFrame], record_type: str, columns) -> pd.DataFrame:
    """Records of one type with the given columns; fields no record had are empty."""
    frame = records.get(record_type)
    if frame is None:
        return pd.DataFrame(columns=columns)
    return frame.reindex(columns=columns)
