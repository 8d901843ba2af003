"""The workers of a job in a few lines at any count (``analysis.worker_digest``): a
64-worker run written by ``tests.helpers.cluster_records`` (killed before any worker
recorded its end of fit, hosts' clocks seconds apart, worker 5 entering each step 3 ms
late) reads in at most 60 lines of text, the late worker named with its cost; and the
pieces on hand-made frames."""

import re

import pandas as pd
import pytest

from keras_dp_tools.analysis.worker_digest import (
    ranked_workers,
    restart_lines,
    stopped_workers,
    worker_names,
)
from keras_dp_tools.report.facade import Report
from tests.helpers.cluster_records import write_cluster_run

WORKERS, STEPS, LATE, LATE_MS, REPLICAS_PER_WORKER = 64, 200, 5, 3.0, 8


@pytest.fixture(scope="module")
def big_job(tmp_path_factory) -> Report:
    log_dir = tmp_path_factory.mktemp("job64")
    write_cluster_run(
        log_dir,
        workers=WORKERS,
        steps=STEPS,
        windows=((100, 105),),
        replicas_per_worker=REPLICAS_PER_WORKER,
        straggler=LATE,
        straggler_ms=LATE_MS,
        fit_ends=False,
        clock_spread_ms=2000.0,
    )
    return Report.load(log_dir)


def test_a_64_worker_report_reads_in_60_lines(big_job):
    text = big_job.text()
    lines = text.splitlines()

    assert len(lines) <= 60, text
    # One line for what all 64 share, none per worker.
    stopped = [line for line in lines if line.startswith("run ") and " stopped " in line]
    assert stopped == [
        f"run {big_job.runs['run'].iloc[0]}: all {WORKERS} workers stopped after step "
        f"{STEPS - 1} (no end of fit recorded: killed, or still running)"
    ]
    # The clocks: the generator put 62 of the 63 others 100 ms or more from worker 0's.
    offsets = big_job.workers.set_index("worker")["clock_offset_ms"]
    far = int((offsets.abs() >= 100).sum())
    assert 50 <= far < WORKERS
    clocks = [line for line in lines if "workers' clocks are" in line]
    assert len(clocks) == 2  # the job line at the top and the advice's title
    assert f"{far} workers' clocks are" in clocks[0]
    assert not [line for line in lines if re.search(r"worker \d+'s clock is", line)]


def test_the_worker_table_ranks_the_late_worker_first_and_sums_up_the_rest(big_job):
    lines = big_job.text().splitlines()

    header = next(n for n, line in enumerate(lines) if line.startswith("Workers (wait"))
    rows = lines[header + 2 : header + 7]
    shown = [int(row.split()[1]) for row in rows]
    assert shown[0] == LATE and len(set(shown)) == 5
    rest = lines[header + 7]
    assert rest.startswith(f"... {WORKERS - 5} more workers of run ")
    # The rest waited about the injected 3 ms (entries spread over 0.4 ms) and were
    # never last.
    low, high = map(float, re.search(r"median_worker_wait_ms ([\d.]+) to ([\d.]+)", rest).groups())
    assert LATE_MS - 0.2 <= low <= high <= LATE_MS + 0.2
    assert "last_to_enter_share 0 to 0" in rest


def test_the_advice_names_the_late_worker_with_its_job_wide_cost(big_job):
    (finding,) = [item for item in big_job.advice() if item.code == "worker-straggler"]

    assert finding.title == f"Worker {LATE} is a straggler"
    waited = float(re.search(r"waited a median ([\d.]+) ms", finding.evidence).group(1))
    assert waited == pytest.approx(LATE_MS, abs=0.2)
    replicas = WORKERS * REPLICAS_PER_WORKER
    idle = re.search(
        r"([\d,]+) replica-ms per step across the job's (\d+) replicas", finding.evidence
    )
    assert int(idle.group(2)) == replicas
    assert float(idle.group(1).replace(",", "")) == pytest.approx(LATE_MS * replicas, rel=0.07)
    gain = float(re.search(r"would be ([\d.]+) ms shorter", finding.evidence).group(1))
    assert LATE_MS - 0.4 <= gain <= LATE_MS


def test_worker_names_are_ranges():
    assert worker_names([3]) == "worker 3"
    assert worker_names([1, 0]) == "workers 0 and 1"
    assert worker_names(range(64)) == "workers 0-63"
    assert worker_names([0, 1, 2, 3, 4, 6, 9, 10, 12]) == "workers 0-4, 6, 9, 10 and 12"


def view(rows) -> pd.DataFrame:
    columns = ["run", "worker", "attempt", "last_step", "ended", "exit"]
    return pd.DataFrame(rows, columns=columns)


def test_a_few_stopped_workers_each_get_a_line_many_alike_one():
    killed = "was killed by SIGKILL"
    few = view([["r", 0, 0, 9, "finished", None], ["r", 1, 0, 5, None, killed]])
    assert stopped_workers(few) == ["run r: worker 1 stopped after step 5 (was killed by SIGKILL)"]

    # Workers 2-9 stopped the same way, at different steps; worker 1 otherwise.
    many = view(
        [["r", 0, 0, 9, "finished", None], ["r", 1, 0, 4, "exited", None]]
        + [["r", worker, 0, 10 + worker, None, killed] for worker in range(2, 10)]
    )
    assert stopped_workers(many) == [
        "run r: worker 1 stopped after step 4 (its process left the fit (an exception))",
        f"run r: 8 workers (2-9) stopped after steps 12 to 19 ({killed})",
    ]


def test_a_job_restarted_whole_is_one_restart_line():
    keys = ["run", "worker", "attempt", "time", "resumed_at_step", "previous_last_step"]
    rows = [["r", worker, 1, 100.0 + worker, 500, 520] for worker in range(16)]
    rows.append(["r", 3, 2, 200.0, 900, 950])
    restarts = pd.DataFrame(rows, columns=keys).assign(redone_steps=21)

    assert restart_lines(restarts) == [
        "Restart: run r workers 0-15 attempt 1 resumed at step 500 (the previous attempt "
        "recorded up to step 520; 21 step(s) ran again).",
        "Restart: run r worker 3 attempt 2 resumed at step 900 (the previous attempt "
        "recorded up to step 950; 21 step(s) ran again).",
    ]


def test_a_few_workers_show_every_row():
    workers = pd.DataFrame(
        {
            "run": "r",
            "worker": [0, 1, 2],
            "median_worker_wait_ms": [4.0, 0.0, 4.1],
            "last_to_enter_share": [0.1, 0.8, 0.1],
            "median_host_gap_ms": [0.5, 4.0, 0.7],
            "clock_offset_ms": 0.0,
            "clock_residual_ms": 0.0,
        }
    )
    shown, rest = ranked_workers(workers)
    assert shown["worker"].tolist() == [1, 2, 0] and rest == []
