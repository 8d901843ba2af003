"""One finding type: the advisor, the batching check, the lint and the GPU notes all give a
``kdt.Finding``, and the old names construct it with the text they always printed."""

import dataclasses

import pandas as pd

import keras_dp_tools as kdt
from keras_dp_tools.analysis.advice import advice_markdown
from keras_dp_tools.analysis.runner import run_advice_markdown
from keras_dp_tools.analysis.utilization import misleading_utilization
from keras_dp_tools.checks.batching import unknown_batch
from keras_dp_tools.checks.lint.checker import check_source
from keras_dp_tools.records.writer import worker_records_path
from tests.helpers.recorded_runs import BALANCED, COMM_HEAVY, write_run


def test_every_producer_gives_the_one_type():
    advice = kdt.Advice("error", "Title", "The numbers.", "Do this.")
    violation = kdt.LintViolation(3, 24, "KDP001", "batch size 64 is not scaled")
    batching = unknown_batch("a generator")
    # One type: every producer's finding is a Finding with exactly its fields (the old
    # names only keep their argument order), so a presenter reads them all alike.
    for finding in (advice, violation, batching):
        assert isinstance(finding, kdt.Finding)
        assert dataclasses.fields(finding) == dataclasses.fields(kdt.Finding)
    assert isinstance(advice, kdt.Advice) and isinstance(violation, kdt.LintViolation)
    # The old names build the one type by keyword as well (dataclasses.replace does).
    quieter = dataclasses.replace(advice, severity="info")
    assert type(quieter) is kdt.Advice and str(quieter).startswith("[info] Title")
    moved = dataclasses.replace(violation, line=7)
    assert (moved.line, moved.col, moved.code, moved.severity) == (7, 24, "KDP001", "error")
    assert (advice.severity, advice.title, advice.message) == ("error", "Title", "Title")
    assert (violation.severity, violation.line, violation.col) == ("error", 3, 24)
    assert (batching.severity, batching.code) == ("warning", "unknown-batch")


def test_the_old_constructors_print_what_they_always_printed():
    advice = kdt.Advice("warning", "Title", "The numbers.", "Do this.")
    assert str(advice) == "[warning] Title\n  evidence: The numbers.\n  fix: Do this."
    assert advice.to_markdown() == "- **warning: Title**. The numbers. *Fix:* Do this."
    finding = kdt.Finding("error", "missing-multiply", "Too small.", "Multiply.")
    assert str(finding) == "Too small. Fix: Multiply."
    violation = kdt.LintViolation(7, 0, "KDP002", "constant rate")
    assert violation.format("train.py") == "train.py:7:1: KDP002 constant rate"
    assert violation.severity is kdt.Severity.INFO


def test_lint_findings_sort_by_place_and_carry_it():
    found = check_source(
        "import tensorflow as tf\n"
        "strategy = tf.distribute.MirroredStrategy()\n"
        "with strategy.scope():\n"
        "    pass\n"
        "ds = tf.data.Dataset.range(10).batch(64)\n"
        "ds2 = tf.data.Dataset.range(10).batch(32)\n"
        "dist = strategy.experimental_distribute_dataset(ds.concatenate(ds2))\n"
    )
    # 0-based columns of the 64 and the 32, counted by hand.
    assert [(finding.line, finding.col, finding.code) for finding in found] == [
        (5, 37, "KDP001"),
        (6, 38, "KDP001"),
    ]
    assert found == sorted(found) and sorted(reversed(found)) == found
    later = kdt.LintViolation(5, 1, "KDP001", "b")
    earlier = kdt.LintViolation(5, 0, "KDP003", "a")
    assert sorted([later, earlier]) == [earlier, later]
    assert later.to_dict()["line"] == 5 and "col" in later.to_dict()


def test_advisor_findings_have_codes(tmp_path):
    write_run(tmp_path, breakdown=COMM_HEAVY, gpu_util=20.0, batching=[("warning", "x")])
    codes = {finding.code for finding in kdt.Report.load(tmp_path).advice()}
    # Exposed transfer 35% of the step (over 20%), GPUs 20% busy (under 50%), and the
    # recorded batching finding under its own code.
    assert {"communication-bound", "gpu-idle", "x"} <= codes


def test_gpu_notes_are_findings_and_gpu_findings_keeps_their_text():
    polled = pd.DataFrame(
        {
            "run": "r",
            "worker": 0,
            "gpu": [0, 0],
            "time": [1.0, 2.0],
            "sampling": "poll",
            "util_gpu": [90.0, 90.0],
            "sm_activity": [20.0, 20.0],  # under half of 90%: misleading
        }
    )
    (finding,) = misleading_utilization(polled)
    assert (finding.severity, finding.code) == ("info", "misleading-utilization")
    assert "NVML utilization 90% but SM activity 20%" in finding.evidence
    report = kdt.Report(pd.DataFrame(columns=["run"]), pd.DataFrame(), gpu=polled)
    assert report.gpu_findings() == [finding.evidence]
    # SM activity at least half the utilization, or a GPU hardly used: nothing to say.
    for util, sm_activity in ((90.0, 50.0), (25.0, 5.0)):
        readings = polled.assign(util_gpu=util, sm_activity=sm_activity)
        assert misleading_utilization(readings) == [], (util, sm_activity)


def test_the_runner_advises_on_the_run_from_its_offset(tmp_path):
    write_run(tmp_path, run="first", breakdown=COMM_HEAVY)
    path = worker_records_path(tmp_path, 0)
    offset = path.stat().st_size
    write_run(tmp_path, run="second", breakdown=BALANCED, start=5000.0)
    # The communication-bound run is before the offset: the second run has nothing.
    second = run_advice_markdown([(path, offset)], "second")
    assert second == "No findings: nothing stands out in the recorded numbers."
    first = run_advice_markdown([(path, 0)], "first")
    assert first.startswith("- **warning: Communication-bound")
    # Read from the offset, the first run's lines are not there at all.
    unread = run_advice_markdown([(path, offset)], "first")
    assert unread == "No findings: nothing stands out in the recorded numbers."


def test_the_runner_gives_the_reports_advice_with_the_job_findings(tmp_path):
    # A 3-worker job whose worker 2 recorded under a run id of its own (split), worker 0
    # communication-bound: RunAdvisor's markdown is Report.advice() of the run, the
    # split-runs finding about the job included.
    multi = {"workers": 3, "strategy": "CollectiveAllReduceStrategy", "cluster": "c0ffee"}
    for run, worker, breakdown in (
        ("job-a", 0, COMM_HEAVY),
        ("job-a", 1, None),
        ("job-b", 2, None),
    ):
        write_run(
            tmp_path, run=run, worker=worker, breakdown=breakdown, start=1000.0 + worker / 10,
            header_fields=multi,
        )  # fmt: skip
    files = [(worker_records_path(tmp_path, worker), 0) for worker in range(3)]

    markdown = run_advice_markdown(files, "job-a")

    advice = kdt.Report.from_files(files).for_run("job-a").advice()
    assert markdown == advice_markdown(advice)
    codes = [item.code for item in advice]
    assert "split-runs" in codes and "communication-bound" in codes, codes
    assert "job-a (workers 0 and 1) and job-b (worker 2)" in markdown


def test_the_runner_on_one_workers_file_does_not_say_the_others_recorded_nothing(tmp_path):
    # RunAdvisor reads its own worker's file: of a 2-worker job, worker 1's records are
    # in another file, not missing.
    multi = {"workers": 2, "strategy": "CollectiveAllReduceStrategy", "cluster": "c0ffee"}
    for worker in (0, 1):
        write_run(tmp_path, run="job", worker=worker, breakdown=COMM_HEAVY, header_fields=multi)
    alone = [(worker_records_path(tmp_path, 0), 0)]
    assert "missing-worker" in [i.code for i in kdt.Report.from_files(alone).advice()]

    markdown = run_advice_markdown(alone, "job")

    assert "recorded nothing" not in markdown and "Communication-bound" in markdown
    assert markdown.endswith(
        "*From the records of 1 of the job's 2 workers: `kdt.Report.load(log_dir)` reads "
        "every worker's, for the cross-worker findings.*"
    )
    both = [(worker_records_path(tmp_path, worker), 0) for worker in (0, 1)]
    assert "From the records of" not in run_advice_markdown(both, "job")
