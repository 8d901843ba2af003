"""One consistency validator for every breakdown: the analyzer's own rows, and the
made-up records and traces the other tests use, so no fixture contradicts the rules."""

import pandas as pd
import pytest

import keras_dp_tools as kdt
from tests.helpers import recorded_runs
from tests.helpers.consistency import breakdown_problems


def report_problems(report) -> list[str]:
    profiled = report.steps.dropna(subset=["compute_ms"])
    return breakdown_problems(report.replicas) + breakdown_problems(
        profiled, step_column="trace_step_ms"
    )


@pytest.mark.parametrize(
    "name", ["COMM_HEAVY", "BALANCED", "WAITING", "INPUT_BOUND", "SPARSE", "HOST_BOUND"]
)
def test_recorded_run_fixtures_obey_the_rules(tmp_path, name):
    breakdown = getattr(recorded_runs, name)
    recorded_runs.write_run(tmp_path, breakdown=breakdown, stragglers=[2, 2, 2, 1, 2])
    assert report_problems(kdt.Report.load(tmp_path)) == []


def test_windowed_multiworker_fixture_obeys_the_rules(tmp_path):
    recorded_runs.write_windowed_multiworker_run(tmp_path, breakdown=recorded_runs.WAITING)
    assert report_problems(kdt.Report.load(tmp_path)) == []


def test_scaling_fixture_obeys_the_rules(tmp_path):
    recorded_runs.write_scaling_runs(tmp_path)
    assert report_problems(kdt.Report.load(tmp_path)) == []


def test_the_validator_catches_what_the_old_fixtures_did():
    """The fixtures before this validator: a 20 ms step whose parts add up to 10 ms,
    a sync wait longer than the all-reduce it is part of, a bandwidth from nowhere."""
    rows = pd.DataFrame(
        [
            {"step": 1, "replicas": 4, "step_ms": 20.0, "compute_ms": 4.0,
             "exposed_allreduce_ms": 4.0, "input_ms": 0.5, "other_ms": 1.5},
            {"step": 2, "replicas": 4, "step_ms": 10.0, "allreduce_ms": 1.0,
             "sync_wait_ms": 3.0, "transfer_ms": 0.8},
            {"step": 3, "replicas": 4, "steps": 1, "transfer_ms": 4.5,
             "allreduce_bytes": 40_000_000, "busbw_gbps": 12.0},
        ]
    )  # fmt: skip
    problems = breakdown_problems(rows)
    assert any("not step_ms = 20" in line for line in problems)
    assert any("transfer_ms = 3.8, not allreduce_ms = 1" in line for line in problems)
    assert any("busbw_gbps = 12 does not follow" in line for line in problems)
