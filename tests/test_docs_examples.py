"""The docs' examples run as written: each block is read from the file (so an edit to
the docs is what is tested) and run in a fresh interpreter in a folder that holds what
the example expects (a lint target, a recorded run, a trace). Every other fenced block
of README.md and docs/*.md says why it is not run (tests/helpers/doc_blocks.py).
"""

from pathlib import Path

import pytest

import keras_dp_tools as kdt
from tests.helpers.doc_blocks import (
    blocks_run_by_tests,
    documents,
    fenced_blocks,
    python_block,
    run_example,
)
from tests.helpers.gpu_traces import two_gpu_run
from tests.helpers.recorded_runs import COMM_HEAVY, write_run

ROOT = Path(__file__).resolve().parent.parent


def test_public_names_example_runs_without_tensorflow(tmp_path):
    code = python_block("docs/api.md", "## The public names")
    out = run_example(code + "import sys; print('tensorflow' in sys.modules)\n", tmp_path)
    lines = out.splitlines()
    # The lint's finding speaks the advisor's scale: an unscaled .batch(64) is an error.
    assert lines[0].startswith("error train.py:3:") and "KDP001" in lines[0]
    assert lines[1] == (
        "[<Severity.ERROR: 'error'>, <Severity.WARNING: 'warning'>, <Severity.INFO: 'info'>]"
    )
    assert lines[-1] == "False"


def test_overhead_example_measures_our_hooks(tmp_path):
    code = python_block("docs/good-to-know.md", "What the always-on callbacks")
    out = run_example(code, tmp_path).splitlines()[-1]

    assert out.endswith(" ms per step in our hooks"), out
    assert float(out.split()[0]) > 0  # ten steps, each timed inside our hooks
    assert (tmp_path / "logs" / "run1" / "keras_dp" / "worker-0.jsonl").exists()


def test_lint_findings_carry_the_shared_severity(tmp_path):
    (tmp_path / "train.py").write_text(
        "import tensorflow as tf\n"
        "strategy = tf.distribute.MirroredStrategy()\n"
        "ds = tf.data.Dataset.range(8).batch(4)\n"
        "with strategy.scope():\n"
        "    model = build()\n"
        "model.fit(ds, batch_size=4)\n"
    )
    found = {item.code: item for item in kdt.lint_paths([tmp_path / "train.py"])}
    assert found["KDP001"].severity is kdt.Severity.ERROR
    assert found["KDP003"].severity is kdt.Severity.WARNING
    assert found["KDP001"].message == found["KDP001"].violation.message


def test_breakdown_doc_example_runs_on_a_log_dir(gpu_trace, tmp_path):
    two_gpu_run(gpu_trace).write(tmp_path / "runs" / "exp1" / "train")
    out = run_example(
        python_block("docs/breakdown.md", "## Using the analysis without training"), tmp_path
    )
    assert "compute_ms" in out and "replica" in out  # the step rows, then the replica rows


def test_report_doc_plots_example_runs_on_a_recorded_run(tmp_path):
    write_run(tmp_path / "runs" / "exp1", breakdown=COMM_HEAVY)
    out = run_example(python_block("docs/report.md", "## Plots"), tmp_path)
    # No GpuMonitor readings in this run: that plot says so instead of drawing.
    drawn = sorted(path.name for path in tmp_path.glob("*.png"))
    assert drawn == ["comm_share.png", "step_breakdown.png", "step_time.png", "sync_wait.png"]
    assert "GPU utilization" in out and "Median step time" in out


def test_reading_doc_example_prints_the_labelled_summary_and_the_number(tmp_path):
    write_run(tmp_path / "runs" / "exp1", breakdown=COMM_HEAVY)
    out = run_example(python_block("docs/reading.md", "## The summary, row by row"), tmp_path)
    # 3.5 ms of exposed transfer in each 10 ms profiled step: 35.0 %, a fraction of 0.35.
    (line,) = [line for line in out.splitlines() if line.split()[:1] == ["comm_share"]]
    assert line.split() == ["comm_share", "Communication", "share", "%", "35.0"]
    assert float(out.splitlines()[-1]) == pytest.approx(0.35)


def test_readme_quickstart_trains_two_replicas_and_reports(tmp_path):
    out = run_example(python_block("README.md", "## Quickstart"), tmp_path)

    report = kdt.Report.load(tmp_path / "runs" / "quickstart")
    # 20 batches of 64 examples, 2 epochs: 40 steps on 2 replicas (32 examples each).
    assert report.steps["step"].tolist() == list(range(40))
    assert report.runs["replicas"].tolist() == [2] and report.runs["global_batch"].tolist() == [64]
    assert set(report.replicas["replica"]) == {0, 1}  # the profiler window saw both
    assert out.startswith("Summary") and "Advice:" in out


def test_getting_started_shows_the_readme_quickstart():
    assert python_block("docs/getting-started.md", "## Quickstart") == python_block(
        "README.md", "## Quickstart"
    )


@pytest.mark.slow
def test_own_fit_example_checks_the_batch_and_records_the_plan(tmp_path):
    out = run_example(
        python_block("docs/getting-started.md", "## Add it to your own `model.fit`"), tmp_path
    )

    report = kdt.Report.load(tmp_path / "runs" / "exp1")
    # 2 replicas x 64 = 128 examples a step, 10 batches, 2 epochs; the dataset's batch is
    # the global one, so the batching check finds nothing.
    assert report.runs["global_batch"].tolist() == [128]
    assert report.steps["step"].tolist() == list(range(20))
    assert report.batching.empty
    assert "Advice:" in out


def test_report_doc_example_runs_on_a_recorded_run(tmp_path):
    write_run(tmp_path / "runs" / "exp1", run="r1", breakdown=COMM_HEAVY)
    # The example's ``run_id`` stands for a run of yours: here the recorded one.
    run_example('run_id = "r1"\n' + python_block("docs/report.md", "## `kdt.Report`"), tmp_path)

    written = sorted(path.name for path in (tmp_path / "out").iterdir())
    assert "steps.csv" in written and "steps.parquet" in written, written


def test_scaling_doc_helpers_example_runs(tmp_path):
    out = run_example(python_block("docs/scaling.md", "## Helpers"), tmp_path)

    # 4 CPU replicas x 64 = 256 examples a step: the base batch, so lr stays 0.1.
    assert "256" in out and "0.1" in out, out


def test_what_if_doc_example_runs_on_a_recorded_run(tmp_path):
    write_run(tmp_path / "runs" / "two-workers-200mbit", breakdown=COMM_HEAVY)
    code = python_block("docs/tuning.md", "## `what_if`")
    show = "print(kdt.what_if(report, bandwidth_gbps=0.0125)['limited_by'].iloc[0])\n"
    out = run_example(code + show, tmp_path)

    # COMM_HEAVY moves 40 MB a step in 4.5 ms (~9 GB/s); at 0.0125 GB/s that takes seconds.
    assert out.startswith("the link"), out


def test_every_code_block_is_run_or_says_why_not():
    run = blocks_run_by_tests()
    unaccounted = [
        str(block)
        for document in documents()
        for block in fenced_blocks(document)
        if block.not_run_reason is None and (block.document, block.line) not in run
    ]

    assert not unaccounted, (
        "these blocks are neither run by a test (python_block(doc, heading)) nor marked "
        "with <!-- not run: REASON --> on the line before the fence: " + ", ".join(unaccounted)
    )


def test_the_block_check_finds_unmarked_and_marked_blocks(tmp_path):
    text = (
        "# Page\n\n"
        "<!-- not run: needs a Slurm cluster -->\n"
        "```bash\nsrun python train.py\n```\n\n"
        "- a list item:\n\n"
        "  ```python\n  print(1)\n  ```\n"
        "<!-- not run: -->\n"
        "```\noutput\n```\n"
    )
    blocks = fenced_blocks("docs/page.md", text)

    assert [(b.line, b.language, b.not_run_reason) for b in blocks] == [
        (4, "bash", "needs a Slurm cluster"),
        (10, "python", None),  # unmarked: the check would name it
        (14, "", None),  # a marker without a reason does not count
    ]
    assert blocks[1].code == "print(1)\n"
    # A test that reads a block counts it as run, found by reading the test's source.
    test_file = tmp_path / "test_x.py"
    test_file.write_text('python_block("README.md", "## Quickstart")\n')
    readme_quickstart = next(b for b in fenced_blocks("README.md") if b.language == "python")
    assert blocks_run_by_tests([test_file]) == {("README.md", readme_quickstart.line): "test_x.py"}
