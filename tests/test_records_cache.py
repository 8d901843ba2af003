"""The columnar cache of records files (``<records dir>/.cache/<file>.parquet``): a
cached load gives exactly the frames of a JSON Lines load, never stale ones; a run still
writing, a damaged cache and a log dir the cache cannot be written to all load right.
Correctness only: its speed is measured by ``make bench`` (``--only cluster``)."""

import os
import warnings

import pandas as pd
import pytest

from keras_dp_tools.records import reader
from keras_dp_tools.records.reader import read_records_by_type, records_cache_path
from keras_dp_tools.records.writer import RecordWriter, worker_records_path
from keras_dp_tools.report.facade import Report
from tests.helpers.cluster_records import write_cluster_run
from tests.helpers.recorded_runs import step

FRAMES = ["runs", "steps", "replicas", "windows", "gpu", "cpu", "batching", "workers", "restarts"]
STEPS = 600


@pytest.fixture
def cached(monkeypatch):
    """Every records file is cached (the real threshold spares small files); the
    warn-once flag starts fresh."""
    monkeypatch.setattr(reader, "CACHE_MIN_BYTES", 0)
    monkeypatch.setattr(reader, "_cache_warned", False)


@pytest.fixture
def run(tmp_path):
    """Three workers of a profiled multi-worker run, in the callbacks' bytes."""
    write_cluster_run(tmp_path, workers=3, steps=STEPS, windows=((50, 55), (300, 305)), straggler=1)
    return tmp_path


def json_lines_load(log_dir, monkeypatch) -> Report:
    """A load that never touches a cache: what the cache must reproduce."""
    with monkeypatch.context() as patch:
        patch.setattr(reader, "CACHE_MIN_BYTES", float("inf"))
        return Report.load(log_dir)


def assert_same_report(loaded: Report, expected: Report) -> None:
    for name in FRAMES:
        pd.testing.assert_frame_equal(getattr(loaded, name), getattr(expected, name))
    pd.testing.assert_frame_equal(loaded.summary(), expected.summary())


def parsed_bytes(monkeypatch) -> list[int]:
    """Records the size of every JSON Lines chunk parsed from here on."""
    sizes = []
    parse = reader._parse_lines

    def counting(data, path):
        sizes.append(data.size)
        return parse(data, path)

    monkeypatch.setattr(reader, "_parse_lines", counting)
    return sizes


def test_a_cached_load_equals_a_json_lines_load_and_parses_nothing(run, cached, monkeypatch):
    first = Report.load(run)  # parses and writes the cache
    paths = sorted((run / "keras_dp").glob("worker-*.jsonl"))
    assert all(records_cache_path(path).is_file() for path in paths)
    sizes = parsed_bytes(monkeypatch)

    again = Report.load(run)

    assert sizes == []  # every file came from its cache
    expected = json_lines_load(run, monkeypatch)
    assert len(expected.steps) == 3 * STEPS and expected.steps["trace_step_ms"].notna().sum() == 30
    assert_same_report(first, expected)
    assert_same_report(again, expected)


def test_records_appended_after_caching_are_read_and_only_they_are_parsed(run, cached, monkeypatch):
    Report.load(run)
    path = worker_records_path(run, 1)
    before = path.stat().st_size
    writer = RecordWriter(path)  # the run goes on: two more steps
    for number in (STEPS, STEPS + 1):
        writer.write(step(number, run="20261201-120000-c1a5e7", worker=1, time=2e9 + number))
    writer.close()
    sizes = parsed_bytes(monkeypatch)

    grown = Report.load(run)

    assert sizes == [path.stat().st_size - before]  # the new lines alone
    mine = grown.steps[grown.steps["worker"] == 1]
    assert mine["step"].max() == STEPS + 1 and len(mine) == STEPS + 2
    assert_same_report(grown, json_lines_load(run, monkeypatch))
    assert_same_report(Report.load(run), grown)  # the extended cache is the file


def test_a_torn_last_line_is_read_once_the_writer_finishes_it(run, cached, monkeypatch):
    path = worker_records_path(run, 0)
    line = (
        b'{"type":"step","run":"20261201-120000-c1a5e7","worker":0,"time":2000000000.0,'
        b'"epoch":0,"step":%d,"steps":1,"step_ms":50.0,"examples_per_s":1.0,"warmup":false}\n'
        % STEPS
    )
    with open(path, "ab") as file:
        file.write(line[:40])  # the writer is in the middle of a line
    torn = Report.load(run)
    assert torn.steps["step"].max() == STEPS - 1
    with open(path, "ab") as file:
        file.write(line[40:])

    finished = Report.load(run)

    assert finished.steps.loc[finished.steps["worker"] == 0, "step"].max() == STEPS
    assert_same_report(finished, json_lines_load(run, monkeypatch))


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_a_damaged_cache_falls_back_to_the_json_lines_with_one_warning(
    run, cached, monkeypatch, damage
):
    Report.load(run)
    for path in sorted((run / "keras_dp" / reader.CACHE_DIRNAME).glob("*.parquet")):
        content = path.read_bytes()
        damaged = {"truncated": content[: len(content) // 2], "garbage": b"x" * 500}
        path.write_bytes(damaged.get(damage, b""))

    with warnings.catch_warnings(record=True) as given:
        warnings.simplefilter("always")
        loaded = Report.load(run)

    said = [str(warning.message) for warning in given if "columnar copy" in str(warning.message)]
    assert len(said) == 1 and "is damaged" in said[0]
    assert_same_report(loaded, json_lines_load(run, monkeypatch))
    sizes = parsed_bytes(monkeypatch)
    assert_same_report(Report.load(run), loaded)
    assert sizes == []  # the copies were written anew


def test_a_log_dir_the_cache_cannot_be_written_to_loads_with_one_warning(run, cached, monkeypatch):
    def refused(source, target):
        raise PermissionError(30, "Read-only file system", str(target))

    monkeypatch.setattr(reader.os, "replace", refused)

    with warnings.catch_warnings(record=True) as given:
        warnings.simplefilter("always")
        first = Report.load(run)
        second = Report.load(run)

    said = [str(warning.message) for warning in given if "columnar copy" in str(warning.message)]
    assert len(said) == 1 and "Read-only file system" in said[0]
    assert_same_report(first, json_lines_load(run, monkeypatch))
    assert_same_report(second, first)
    left = list((run / "keras_dp" / reader.CACHE_DIRNAME).iterdir())
    assert left == []  # no temporary file left behind


@pytest.mark.parametrize("replacement", ["shorter", "longer"])
def test_a_replaced_records_file_is_never_read_from_its_stale_cache(
    run, cached, monkeypatch, tmp_path_factory, replacement
):
    Report.load(run)
    other = tmp_path_factory.mktemp("other")
    steps = STEPS // 2 if replacement == "shorter" else STEPS * 2
    write_cluster_run(other, workers=3, steps=steps, windows=((10, 15),), seed=7)
    path = worker_records_path(run, 2)
    os.replace(worker_records_path(other, 2), path)

    loaded = Report.load(run)

    assert (loaded.steps["worker"] == 2).sum() == steps
    assert_same_report(loaded, json_lines_load(run, monkeypatch))


def test_a_rewrite_of_the_same_size_and_mtime_is_not_read_from_the_stale_cache(
    run, cached, monkeypatch
):
    # cp -p, rsync -t or a filesystem with coarse mtimes: another file of the same size
    # and modification time. Only its bytes tell.
    Report.load(run)
    path = worker_records_path(run, 2)
    before = path.stat()
    text = path.read_text()
    slower = text.replace('"step_ms":1', '"step_ms":2')  # 10-19 ms steps: 20-29 ms
    assert slower != text and len(slower) == len(text)
    path.write_text(slower)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_mtime_ns == before.st_mtime_ns

    loaded = Report.load(run)

    assert_same_report(loaded, json_lines_load(run, monkeypatch))


def test_damaged_lines_warn_on_every_load_cached_or_not(run, cached, monkeypatch):
    path = worker_records_path(run, 0)
    lines = path.read_bytes().splitlines(keepends=True)
    cut = next(n for n in range(100, len(lines)) if lines[n].startswith(b'{"type":"step"'))
    lines[cut] = b'{"type":"step","ru\n'  # a line a crash cut short, closed off by the writer
    path.write_bytes(b"".join(lines))

    for _ in range(2):  # parsed, then from the cache
        with pytest.warns(UserWarning, match="skipped 1 damaged line"):
            loaded = Report.load(run)
        assert (loaded.steps["worker"] == 0).sum() == STEPS - 1


def test_reading_from_a_byte_offset_reads_the_json_lines(run, cached):
    path = worker_records_path(run, 0)
    Report.load(run)
    lines = path.read_bytes().splitlines(keepends=True)
    offset = sum(map(len, lines[:200]))

    frames = read_records_by_type(path, offset)

    everything = read_records_by_type(path)
    assert frames["step"]["step"].min() > 0
    assert len(frames["step"]) < len(everything["step"])
    expected = everything["step"][everything["step"]["time"] >= frames["step"]["time"].min()]
    pd.testing.assert_frame_equal(frames["step"], expected.reset_index(drop=True))


def test_a_file_that_is_not_records_still_raises(tmp_path, cached):
    path = worker_records_path(tmp_path, 0)
    path.parent.mkdir(parents=True)
    path.write_text('{"a": 1}\n' * 100)

    with pytest.raises(ValueError, match="is not keras_dp_tools records"):
        Report.load(tmp_path)
    assert not records_cache_path(path).exists()
