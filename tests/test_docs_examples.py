"""The docs' examples of the public names run as written: each block is read from the
file (so an edit to the docs is what is tested) and run in a fresh interpreter in a
folder that holds what the example expects (a lint target, a recorded run, a trace)."""

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.helpers.gpu_traces import two_gpu_run
from tests.helpers.recorded_runs import COMM_HEAVY, write_run

ROOT = Path(__file__).resolve().parent.parent


def python_block(document: str, heading: str) -> str:
    """The first ```python block after ``heading`` in ``document`` (under ROOT), without
    the indent of a block inside a list item."""
    text = (ROOT / document).read_text()
    start = text.index(heading)
    match = re.compile(r"```python\n(.*?)```", re.S).search(text, start)
    assert match is not None, f"no python block after {heading!r} in {document}"
    return textwrap.dedent(match.group(1))


def run_example(code: str, cwd: Path) -> str:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_readme_public_names_example_runs_without_tensorflow(tmp_path):
    code = python_block("README.md", "## The public names")
    out = run_example(code + "import sys; print('tensorflow' in sys.modules)\n", tmp_path)
    lines = out.splitlines()
    # The lint's finding speaks the advisor's scale: an unscaled .batch(64) is an error.
    assert lines[0].startswith("error train.py:3:") and "KDP001" in lines[0]
    assert lines[1] == (
        "[<Severity.ERROR: 'error'>, <Severity.WARNING: 'warning'>, <Severity.INFO: 'info'>]"
    )
    assert lines[-1] == "False"


def test_readme_overhead_example_measures_our_hooks(tmp_path):
    code = python_block("README.md", "What the always-on callbacks")
    out = run_example(code, tmp_path).splitlines()[-1]

    assert out.endswith(" ms per step in our hooks"), out
    assert float(out.split()[0]) > 0  # ten steps, each timed inside our hooks
    assert (tmp_path / "logs" / "run1" / "keras_dp" / "worker-0.jsonl").exists()


def test_lint_findings_carry_the_shared_severity(tmp_path):
    import keras_dp_tools as kdt

    (tmp_path / "train.py").write_text(
        "import tensorflow as tf\n"
        "strategy = tf.distribute.MirroredStrategy()\n"
        "ds = tf.data.Dataset.range(8).batch(4)\n"
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
    assert "GPU utilization" in out and "median step time (ms)" in out
