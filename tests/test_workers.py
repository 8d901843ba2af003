"""Cross-worker waiting, clock alignment, restarts and stops on hand-built records."""

import pandas as pd
import pytest

import keras_dp_tools as kdt
from keras_dp_tools.analysis.clocks import cross_worker_sync
from keras_dp_tools.records.writer import RecordWriter, worker_records_path
from keras_dp_tools.report import plots
from tests.helpers.recorded_runs import header

STEP_S = 0.100  # worker 0's steps: entered every 100 ms
LATE_S = 0.040  # worker 1 enters each step 40 ms after worker 0
CLOCK_S = 1000.0  # worker 1's clock runs 1000 s ahead of worker 0's


def two_workers(tmp_path, steps=12, jitter=None, breakdown=True, finished=(True, False)):
    """Worker 1 enters every step 40 ms late (host work before the step); both leave
    the all-reduce together at the step end. Worker 0 profiles steps 3-7, where its
    own trace shows the wait as 45 ms of transfer (it cannot see worker 1)."""
    jitter = jitter or [0.0] * steps
    for worker in (0, 1):
        writer = RecordWriter(worker_records_path(tmp_path, worker))
        clock = CLOCK_S * worker
        writer.write(
            {**header("mw", worker), "time": 10.0 + clock, "replicas": 2, "workers": 2}
            | {"pid": 100 + worker, "hostname": f"host{worker}"}
        )
        for step in range(steps):
            step_start = 100.0 + STEP_S * step
            # The shared instant all leave together, as worker 1's clock reads it (jitter).
            end = step_start + 0.080 + (jitter[step] if worker else 0.0)
            enter = step_start + (LATE_S if worker else 0.0)
            writer.write(
                {"type": "step", "run": "mw", "worker": worker, "epoch": 0, "step": step}
                | {"steps": 1, "time": enter + clock, "step_ms": 1000 * (end - enter)}
                | {"warmup": step == 0}
            )
            if breakdown and worker == 0 and 3 <= step < 8:
                writer.write(
                    {"type": "step_breakdown", "run": "mw", "worker": 0, "step": step}
                    | {"time": enter, "step_ms": 80.0, "compute_ms": 30.0}
                    | {"allreduce_ms": 45.0, "sync_wait_ms": 0.0, "transfer_ms": 45.0}
                    | {"exposed_allreduce_ms": 45.0, "exposed_sync_wait_ms": 0.0}
                    | {"exposed_transfer_ms": 45.0, "input_ms": 0.0, "other_ms": 5.0}
                    | {"comm_share": 45 / 80, "wait_share": 0.0, "allreduce_bytes": 1000}
                    | {"max_sync_wait_ms": 0.0}
                    | {"algbw_gbps": 1000 / 0.045 / 1e9, "busbw_gbps": 1000 / 0.045 / 1e9}
                )
        if finished[worker]:
            writer.write(
                {"type": "fit_end", "run": "mw", "worker": worker, "time": 200.0 + clock}
                | {"step": steps, "status": "finished"}
            )
        writer.close()
    return kdt.Report.load(tmp_path)


def test_clocks_are_aligned_at_the_step_ends_and_late_entry_is_waiting(tmp_path):
    report = two_workers(tmp_path)

    workers = report.workers.set_index("worker")
    assert workers.loc[1, "clock_offset_ms"] == pytest.approx(1000 * CLOCK_S)
    assert workers.loc[1, "clock_residual_ms"] == pytest.approx(0.0, abs=1e-3)
    # Worker 0 waited 40 ms for worker 1 in every step; worker 1 waited for nobody.
    assert workers.loc[0, "median_worker_wait_ms"] == pytest.approx(40.0, abs=1e-3)
    assert workers.loc[1, "median_worker_wait_ms"] == pytest.approx(0.0, abs=1e-3)
    assert workers.loc[1, "last_to_enter_share"] == 1.0
    # Between calls: worker 0 idles 20 ms (100 - 80), worker 1 60 ms (its 40 ms of host work).
    assert workers.loc[0, "median_host_gap_ms"] == pytest.approx(20.0, abs=1e-3)
    assert workers.loc[1, "median_host_gap_ms"] == pytest.approx(60.0, abs=1e-3)


def test_worker_wait_moves_from_transfer_to_sync_wait_in_profiled_steps(tmp_path):
    report = two_workers(tmp_path)

    profiled = report.steps[(report.steps["worker"] == 0) & report.steps["trace_step_ms"].notna()]
    assert len(profiled) == 5
    # The trace said 45 ms transfer, 0 wait; 40 of it was waiting for worker 1.
    assert profiled["sync_wait_ms"].tolist() == pytest.approx([40.0] * 5, abs=1e-3)
    assert profiled["transfer_ms"].tolist() == pytest.approx([5.0] * 5, abs=1e-3)
    assert profiled["exposed_sync_wait_ms"].tolist() == pytest.approx([40.0] * 5, abs=1e-3)
    assert profiled["wait_share"].tolist() == pytest.approx([0.5] * 5, abs=1e-4)
    assert profiled["max_sync_wait_ms"].tolist() == pytest.approx([40.0] * 5, abs=1e-3)
    # 1000 bytes in 5 ms instead of 45 ms: 9x the bandwidth.
    assert profiled["algbw_gbps"].iloc[0] == pytest.approx(1000 / 0.005 / 1e9)


def test_advice_names_the_slow_worker_and_why(tmp_path):
    report = two_workers(tmp_path)

    advice = [item for item in report.advice() if "straggler" in item.title]

    assert [item.title for item in advice] == ["Worker 1 is a straggler"]
    assert "waited a median 40.0 ms" in advice[0].evidence
    assert "60.0 ms between train calls" in advice[0].evidence
    assert "callbacks" in advice[0].fix
    assert "Worker 1 is a straggler" in report.summary().loc["mw", "advice"]


def test_clock_residual_reports_how_well_the_step_ends_agree(tmp_path):
    # Worker 1 reads the shared step end 1 ms early or late in 6 of 11 timed steps.
    jitter = [0.0, 0.0, 0.001, -0.001, 0.001, -0.001, 0.001, -0.001, 0.0, 0.0, 0.0, 0.0]
    steps = two_workers(tmp_path, jitter=jitter).steps
    sync = cross_worker_sync(steps).set_index(["worker", "step"])

    # Offset: the median skew (0 ms beyond the 1000 s); residual: the median |deviation|.
    assert sync.loc[(1, 5), "clock_offset_ms"] == pytest.approx(1000 * CLOCK_S, abs=1e-3)
    assert sync.loc[(1, 5), "clock_residual_ms"] == pytest.approx(1.0, abs=1e-3)
    # Entry times are exact, so worker 0's wait stays 40 ms whatever the end jitter.
    assert sync.loc[0, "worker_wait_ms"].median() == pytest.approx(40.0, abs=1e-3)


def test_a_worker_that_recorded_no_end_is_named_as_stopped(tmp_path):
    report = two_workers(tmp_path, steps=6, breakdown=False, finished=(True, False))

    text = report.text()

    assert "Workers that stopped before the end of fit:" in text
    assert "run mw: worker 1 stopped after step 5 (no end of fit recorded" in text
    assert "worker 0 stopped" not in text


def test_worker_wait_plot_has_a_line_per_worker(tmp_path):
    report = two_workers(tmp_path)

    figure = plots.worker_wait(report)

    lines = figure.axes[0].get_lines()
    assert [line.get_label() for line in lines] == ["worker 0", "worker 1"]
    assert pd.Series(lines[0].get_ydata()).median() == pytest.approx(40.0, abs=1e-3)


def test_a_second_fit_killed_after_a_finished_one_is_not_finished(tmp_path):
    writer = RecordWriter(worker_records_path(tmp_path, 0))
    writer.write({**header("r"), "time": 1.0, "pid": 7, "hostname": "h"})
    for step, at in [(0, 2.0), (1, 3.0), (2, 4.0), (3, 7.0)]:  # fit 2 starts at step 3
        writer.write(
            {"type": "step", "run": "r", "worker": 0, "epoch": 0, "step": step, "steps": 1}
            | {"time": at, "step_ms": 10.0, "warmup": step in (0, 3)}
        )
        if step == 2:  # fit 1 ended; fit 2 was killed after its first step
            writer.write(
                {"type": "fit_end", "run": "r", "worker": 0, "time": 5.5, "step": 3}
                | {"status": "finished"}
            )
    writer.close()

    report = kdt.Report.load(tmp_path)

    assert pd.isna(report.workers.loc[0, "ended"])
    assert "worker 0 stopped after step 3" in report.text()


def test_host_gap_and_redone_steps_are_per_attempt_after_a_restart(tmp_path):
    # Attempt 0 runs steps 0-9 with 2 ms between calls; the process restarts from a
    # checkpoint at step 6 and attempt 1 runs steps 6-14 with 7 ms between calls, in a
    # file written out of order (the report orders it).
    writer = RecordWriter(worker_records_path(tmp_path, 0))
    lines = []
    for attempt, (first, last, gap_s, start) in enumerate(
        [(0, 9, 0.002, 100.0), (6, 14, 0.007, 200.0)]
    ):
        lines.append({**header("r", 0), "time": start - 1.0, "pid": 10 + attempt, "hostname": "h"})
        for index, step in enumerate(range(first, last + 1)):
            lines.append(
                {"type": "step", "run": "r", "worker": 0, "epoch": 0, "step": step, "steps": 1}
                | {"time": start + index * (0.010 + gap_s), "step_ms": 10.0, "warmup": index == 0}
            )
    for line in [lines[0], *reversed(lines[1:11]), *lines[11:]]:
        writer.write(line)
    writer.close()

    report = kdt.Report.load(tmp_path)

    workers = report.workers.set_index("attempt")
    assert workers["median_host_gap_ms"].tolist() == pytest.approx([2.0, 7.0], abs=1e-6)
    assert workers["first_step"].tolist() == [0, 6]
    assert workers["last_step"].tolist() == [9, 14]
    steps = report.steps  # by step; a step run twice in file order (attempt 0 first)
    assert steps[["step", "attempt"]].to_numpy().tolist()[5:9] == [[5, 0], [6, 0], [6, 1], [7, 0]]
    redone = steps[steps["redone"]]
    assert redone["attempt"].unique().tolist() == [0]
    assert redone["step"].tolist() == [6, 7, 8, 9]
    assert report.restarts.loc[0, "redone_steps"] == 4
