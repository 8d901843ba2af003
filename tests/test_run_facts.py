"""RunFacts: written into a window record and read back as the same facts, also through
the records' reader (Arrow and pandas types), and what ``keras-dp analyze`` takes from
the records: a window's own facts, or for records written before those fields the
run's header (its devices and replicas)."""

import pytest

from keras_dp_tools.records.facts import RunFacts
from keras_dp_tools.records.reader import read_records_by_type
from keras_dp_tools.records.writer import SCHEMA_VERSION, RecordWriter, worker_records_path
from keras_dp_tools.tools.cli import _recorded_facts

DEVICES = ["/job:localhost/replica:0/task:0/device:GPU:0", "/gpu:1"]
FACTS = RunFacts(
    worker=0,
    local_replicas=2,
    replicas_in_sync=8,
    devices=DEVICES,
    global_batch=256,
    steps_per_execution=4,
    allreduce_bytes=4096,
    sparse_bytes=1024,
    gather_bytes=512,
    steps_covered={12: 4, 16: 4},
)
HEADER = {"type": "header", "schema": SCHEMA_VERSION, "run": "r1", "worker": 0, "time": 1.0}


def write_window(log_dir, window_fields: dict, header_fields: dict) -> None:
    writer = RecordWriter(worker_records_path(log_dir, 0))
    writer.write({**HEADER, **header_fields})
    window = {"type": "window", "run": "r1", "worker": 0, "time": 2.0, "window": 0}
    writer.write({**window, "trace": "train/plugins/profile/x/h.xplane.pb", **window_fields})


def test_a_record_written_and_read_back_holds_the_same_facts(tmp_path):
    assert RunFacts.from_record(FACTS.to_record()) == FACTS
    write_window(tmp_path, FACTS.to_record(), {})
    window = read_records_by_type(worker_records_path(tmp_path, 0))["window"]
    assert RunFacts.from_record(window.to_dict("records")[0]) == FACTS


def test_keras_dp_analyze_takes_the_windows_facts(tmp_path):
    # The header says otherwise (4 replicas in sync): the window's own facts win.
    write_window(tmp_path, FACTS.to_record(), {"replicas": 4, "devices": ["/cpu:0"]})
    trace = (tmp_path / "train/plugins/profile/x/h.xplane.pb").resolve()
    assert _recorded_facts(tmp_path) == {trace: FACTS}


def test_older_records_take_devices_and_replicas_from_the_header(tmp_path):
    write_window(tmp_path, {"allreduce_bytes": 4096}, {"replicas": 8, "devices": DEVICES})
    trace = (tmp_path / "train/plugins/profile/x/h.xplane.pb").resolve()
    expected = RunFacts(local_replicas=2, replicas_in_sync=8, devices=DEVICES, worker=0)
    assert _recorded_facts(tmp_path) == {
        trace: RunFacts(**{**vars(expected), "allreduce_bytes": 4096})
    }


def test_a_field_holding_something_else_is_named_with_its_value():
    with pytest.raises(ValueError, match=r"'local_replicas' is 'two'"):
        RunFacts.from_record({"local_replicas": "two"})
    with pytest.raises(ValueError, match=r"'steps_covered' is \[3\]"):
        RunFacts.from_record({"steps_covered": [3]})
