"""Records round trip: writer, reader, damaged files. No TensorFlow."""

import json
import math

import pandas as pd
import pytest

from keras_dp_tools.records import (
    SCHEMA_VERSION,
    RecordWriter,
    find_record_files,
    read_records,
    worker_records_path,
)


def header(run="r1", worker=0, **fields):
    return {"type": "header", "schema": SCHEMA_VERSION, "run": run, "worker": worker, **fields}


def step(step, run="r1", worker=0, **fields):
    record = {
        "type": "step",
        "run": run,
        "worker": worker,
        "epoch": 0,
        "step": step,
        "steps": 1,
        "step_ms": 10.0 + step,
        "warmup": step == 0,
    }
    return {**record, **fields}


def write(path, records):
    writer = RecordWriter(path)
    for record in records:
        writer.write(record)
    writer.close()


def test_round_trip_keeps_values_and_types(tmp_path):
    path = worker_records_path(tmp_path, 0)
    write(path, [header(devices=["/cpu:0", "/cpu:1"], replicas=2), step(0), step(1)])

    frame = read_records(path)

    assert list(frame["type"]) == ["header", "step", "step"]
    assert frame.loc[0, "devices"].tolist() == ["/cpu:0", "/cpu:1"]
    steps = frame[frame["type"] == "step"]
    assert steps["step"].tolist() == [0, 1]
    assert steps["step_ms"].tolist() == [10.0, 11.0]
    assert steps["warmup"].tolist() == [True, False]
    assert str(frame["step"].dtype) == "Int64"  # nullable: the header row has no step


def test_torn_last_line_is_ignored(tmp_path):
    path = worker_records_path(tmp_path, 0)
    write(path, [header(), step(0), step(1)])
    with open(path, "ab") as file:
        file.write(b'{"type":"step","run":"r1","wor')  # the writer died mid-line

    frame = read_records(path)

    assert frame["step"].dropna().tolist() == [0, 1]


def test_appending_after_a_torn_line_keeps_the_new_records(tmp_path):
    path = worker_records_path(tmp_path, 0)
    write(path, [header(), step(0)])
    with open(path, "ab") as file:
        file.write(b'{"type":"step","ru')
    write(path, [header(run="r2"), step(0, run="r2")])

    with pytest.warns(UserWarning, match="skipped 1 damaged line"):
        frame = read_records(path)

    assert frame.groupby("run")["type"].apply(list).to_dict() == {
        "r1": ["header", "step"],
        "r2": ["header", "step"],
    }


def test_non_finite_numbers_are_stored_as_null(tmp_path):
    path = worker_records_path(tmp_path, 0)
    write(path, [step(1, step_ms=math.nan, examples_per_s=math.inf)])

    assert json.loads(path.read_text())["step_ms"] is None
    frame = read_records(path)
    assert pd.isna(frame.loc[0, "step_ms"]) and pd.isna(frame.loc[0, "examples_per_s"])


def test_unknown_fields_from_newer_versions_are_kept(tmp_path):
    path = worker_records_path(tmp_path, 0)
    write(path, [header(schema=SCHEMA_VERSION + 1), step(0, future_ms=1.5)])

    with pytest.warns(UserWarning, match="Upgrade keras_dp_tools"):
        frame = read_records(path)

    assert frame["future_ms"].dropna().tolist() == [1.5]


def test_empty_and_torn_only_files_read_as_empty(tmp_path):
    empty = tmp_path / "a" / "keras_dp" / "worker-0.jsonl"
    empty.parent.mkdir(parents=True)
    empty.write_bytes(b"")
    torn = tmp_path / "b" / "keras_dp" / "worker-0.jsonl"
    torn.parent.mkdir(parents=True)
    torn.write_bytes(b'{"type":"hea')

    for path in (empty, torn):
        frame = read_records(path)
        assert len(frame) == 0 and "step_ms" in frame


def test_wrong_field_types_raise_a_clear_error(tmp_path):
    path = tmp_path / "worker-0.jsonl"
    path.write_text('{"type":"step","step":"seven"}\n')

    with pytest.raises(ValueError, match="wrong types"):
        read_records(path)


def test_writer_refuses_writes_after_close(tmp_path):
    writer = RecordWriter(tmp_path / "w.jsonl")
    writer.close()

    with pytest.raises(ValueError, match="closed"):
        writer.write(step(0))


def test_find_record_files_searches_runs_recursively(tmp_path):
    for run, worker in [("sweep/n1", 0), ("sweep/n2", 0), ("sweep/n2", 1)]:
        write(worker_records_path(tmp_path / run, worker), [header()])

    assert len(find_record_files(tmp_path / "sweep")) == 3
    assert len(find_record_files([tmp_path / "sweep/n1", tmp_path / "sweep/n2"])) == 3
    assert len(find_record_files(tmp_path / "sweep/n2/keras_dp")) == 2
    assert len(find_record_files(worker_records_path(tmp_path / "sweep/n1", 0))) == 1


def test_find_record_files_says_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="No such file"):
        find_record_files(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match=r"keras_dp/worker-<i>\.jsonl"):
        find_record_files(tmp_path)


def test_reading_from_a_line_offset_leaves_out_the_lines_before_it(tmp_path):
    from keras_dp_tools.records import read_records_by_type

    path = tmp_path / "worker-0.jsonl"
    writer = RecordWriter(path)
    for record in (header("r1"), step(0, "r1"), header("r2"), step(0, "r2"), step(1, "r2")):
        writer.write(record)
    writer.close()
    lines = path.read_bytes().splitlines(keepends=True)
    offset = len(lines[0]) + len(lines[1])  # where run r2's header begins

    frames = read_records_by_type(path, offset)

    assert frames["header"]["run"].tolist() == ["r2"]
    assert frames["step"]["step"].tolist() == [0, 1]
    assert read_records_by_type(path, path.stat().st_size) == {}  # nothing after the end
