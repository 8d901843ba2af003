"""The benchmark script keeps working: a smoke run (seconds) writes its table. Its
numbers are not checked: timings belong in `make bench`, not in assertions."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_bench_smoke_run_writes_the_results_table(tmp_path):
    output = tmp_path / "RESULTS.md"
    run = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench.py"), "--smoke", "--output", str(output)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    table = output.read_text()
    for section in (
        "Training overhead",
        "Steps after a window",
        "XProf's `input_pipeline_analyzer`",
        "Synthetic traces",
        "`Report.load`",
        "`Report.load` at cluster scale",
        "One window of a 512-GPU job",
    ):
        assert section in table
    assert "| tiny |" in table and "| 2,000 |" in table and "| 1,000 |" in table
    assert "4 workers x 6,000 steps" in table and "first (JSON Lines -> cache)" in table
    assert "| 2 | " in table and "| 0 | 4 | 1 in 4 of 4 steps |" in table  # 2 workers, none failed


@pytest.mark.slow
def test_strategies_netns_smoke_run_writes_its_section(tmp_path):
    from tests.helpers.netns import namespaces_unavailable

    reason = namespaces_unavailable()
    if reason:
        pytest.skip(reason)
    pytest.importorskip("tf_keras", reason="the parameter-server candidate needs tf_keras")
    output = tmp_path / "RESULTS.md"
    script = str(ROOT / "benchmarks" / "bench.py")
    command = [sys.executable, script, "--smoke", "--only", "strategies-netns"]
    run = subprocess.run(
        [*command, "--output", str(output)], capture_output=True, text=True, timeout=900
    )
    assert run.returncode == 0, run.stderr[-3000:]
    table = output.read_text()
    assert "ParameterServerStrategy over a rate-limited link" in table
    assert "| parameter_server |" in table and "| mirrored |" in table
    assert "The parameter-server candidate is " in table
