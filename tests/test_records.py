"""Records round trip: writer, reader, damaged files. No TensorFlow."""

import json
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keras_dp_tools.records.reader import find_record_files, read_records
from keras_dp_tools.records.writer import (
    SCHEMA_VERSION,
    RecordTemplate,
    RecordWriter,
    encode_record,
    worker_records_path,
)
from tests.helpers.recorded_runs import header, step, write_records


def test_round_trip_keeps_values_and_types(tmp_path):
    path = worker_records_path(tmp_path, 0)
    write_records(path, [header(devices=["/cpu:0", "/cpu:1"], replicas=2), step(0), step(1)])

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
    write_records(path, [header(), step(0), step(1)])
    with open(path, "ab") as file:
        file.write(b'{"type":"step","run":"r1","wor')  # the writer died mid-line

    frame = read_records(path)

    assert frame["step"].dropna().tolist() == [0, 1]


def test_appending_after_a_torn_line_keeps_the_new_records(tmp_path):
    path = worker_records_path(tmp_path, 0)
    write_records(path, [header(), step(0)])
    with open(path, "ab") as file:
        file.write(b'{"type":"step","ru')
    write_records(path, [header(run="r2"), step(0, run="r2")])

    with pytest.warns(UserWarning, match="skipped 1 damaged line"):
        frame = read_records(path)

    assert frame.groupby("run")["type"].apply(list).to_dict() == {
        "r1": ["header", "step"],
        "r2": ["header", "step"],
    }


def test_non_finite_numbers_are_stored_as_null(tmp_path):
    path = worker_records_path(tmp_path, 0)
    write_records(path, [step(1, step_ms=math.nan, examples_per_s=math.inf)])

    assert json.loads(path.read_text())["step_ms"] is None
    frame = read_records(path)
    assert pd.isna(frame.loc[0, "step_ms"]) and pd.isna(frame.loc[0, "examples_per_s"])


def test_unknown_fields_from_newer_versions_are_kept(tmp_path):
    path = worker_records_path(tmp_path, 0)
    write_records(path, [header(schema=SCHEMA_VERSION + 1), step(0, future_ms=1.5)])

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
        write_records(worker_records_path(tmp_path / run, worker), [header()])

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
    from keras_dp_tools.records.reader import read_records_by_type

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


# Values a record may hold: the template's own (plain floats of every kind, ints of any
# size, booleans, None) and some it must leave to json (text, lists, numpy scalars).
_VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.booleans(),
    st.none(),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
    st.floats(allow_nan=True).map(np.float64),  # a float subclass: json writes it
    st.integers(-5, 5).map(np.int64),  # not JSON: the record is refused either way
)


def _as_json_writes_it(value):
    # The records' rule, stated independently: NaN and infinities become null.
    return None if isinstance(value, float) and not math.isfinite(value) else value


@settings(max_examples=400, deadline=None)
@given(
    head=st.dictionaries(st.text(max_size=6), st.one_of(st.text(max_size=6), st.integers())),
    fields=st.dictionaries(st.text(max_size=6), _VALUES, max_size=8),
)
def test_record_template_writes_what_json_writes(head, fields):
    keys = tuple(fields)
    template = RecordTemplate(head, keys)
    values = tuple(fields.values())
    record = {**head, **fields}

    if any(isinstance(value, np.int64) for value in values):
        assert template.line(values) is None
        with pytest.raises(TypeError):
            encode_record(record)  # the recorder drops such a record with a warning
        return
    line = template.line(values)
    if line is None:  # the caller's fallback
        line = encode_record(record)

    expected = {key: _as_json_writes_it(value) for key, value in record.items()}
    assert line == (json.dumps(expected, separators=(",", ":")) + "\n").encode()
    assert json.loads(line) == expected
    plain = all(
        type(value) in (int, bool, type(None)) or (type(value) is float and math.isfinite(value))
        for value in values
    )
    if plain and not set(head) & set(fields):
        assert template.line(values) == line  # the fast path took it


def test_record_template_handles_a_step_record_and_its_edge_values():
    keys = ("time", "epoch", "step", "steps", "step_ms", "examples_per_s", "warmup")
    head = {"type": "step", "run": "run-%s-\u00e9\u4e2d", "worker": 3}
    template = RecordTemplate(head, keys)
    cases = [
        (1764461520.123456, 0, 12, 1, 15.5, 33000.25, True),
        (1e16, 2**70, 0, 4, -0.0, None, False),
        (5e-324, -1, 1, 1, 1.7976931348623157e308, 1e-07, False),
        (1.0, 0, 1, 1, float("nan"), float("inf"), False),
        (1.0, 0, 1, 1, 2.5, float("-inf"), True),
    ]
    for values in cases:
        record = {**head, **dict(zip(keys, values, strict=True))}
        line = template.line(values) or encode_record(record)
        expected = {key: _as_json_writes_it(value) for key, value in record.items()}
        assert json.loads(line) == expected
        assert line == (json.dumps(expected, separators=(",", ":")) + "\n").encode()
    assert template.line(cases[0]) is not None
    assert template.line(cases[3]) is None  # NaN: json's path writes null
    assert template.line((1.0,) * 6) is None  # a value short: not this template's shape


def test_writing_records_loads_neither_pandas_nor_arrow():
    # The training process writes records; the reader's libraries stay out of it.
    import subprocess
    import sys

    code = (
        "import sys, tempfile\n"
        "import keras_dp_tools.capture.recorder\n"
        "from keras_dp_tools.records.writer import RecordWriter, worker_records_path\n"
        "writer = RecordWriter(worker_records_path(tempfile.mkdtemp(), 0))\n"
        "writer.write({'type': 'header', 'schema': 1, 'run': 'r', 'worker': 0})\n"
        "writer.write({'type': 'step', 'run': 'r', 'worker': 0, 'step': 1, 'step_ms': 9.5})\n"
        "writer.close()\n"
        "print(sorted({'pandas', 'pyarrow'} & set(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
