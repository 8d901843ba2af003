"""One window of a multi-worker job: every worker's trace analysed in parallel
(``runner.analyze_windows``), each worker's step rows its own."""

import io

import pandas as pd
import pytest

from keras_dp_tools.analysis.runner import analyze_windows
from keras_dp_tools.records.facts import RunFacts


@pytest.fixture(scope="module")
def worker_traces(tf, tmp_path_factory):
    """Three workers' traces: two_gpu_run (steps 1 and 2: 11 ms, as Adam runs past the
    first marker, and 10 ms) twice, and once with a kernel more on GPU 0 in step 2
    (18.0-18.8 ms, where it idled); and a torn file."""
    from tests.helpers.gpu_traces import GpuTrace, two_gpu_run

    folder = tmp_path_factory.mktemp("workers")
    paths = [two_gpu_run(GpuTrace).write(folder / f"worker-{index}") for index in range(2)]
    slower = two_gpu_run(GpuTrace)
    slower.kernel(0, 13, "void slower_gemm(float*)", 18.0, 18.8, 130, launched_at=10.25)
    paths.append(slower.write(folder / "worker-2"))
    torn = folder / "torn.xplane.pb"
    torn.write_bytes(paths[0].read_bytes()[:-200])
    return paths, torn


def test_windows_analysed_in_processes_give_the_rows_of_one_process(worker_traces):
    """jobs=2 (child processes) and jobs=1 (here) give the same rows; the step times
    are two_gpu_run's (11 and 10 ms); the progress counts every trace once; the
    torn trace fails alone, named, while the others are analysed."""
    from tests.helpers.gpu_traces import GRADIENT_BYTES

    paths, torn = worker_traces
    windows = [(path, RunFacts(allreduce_bytes=GRADIENT_BYTES)) for path in paths]
    windows.insert(1, (torn, None))
    seen = []
    parallel = analyze_windows(
        windows, 2, xprof=False, progress=lambda done, total, w: seen.append((done, total))
    )
    serial = analyze_windows(windows, 1, xprof=False)
    assert sorted(seen) == [(n, 4) for n in range(1, 5)]
    assert [w.trace for w in parallel] == [path for path, _ in windows]
    assert isinstance(parallel[1].error, ValueError) and str(torn) in str(parallel[1].error)
    assert parallel[1].breakdown is None and isinstance(serial[1].error, ValueError)
    for ours, theirs in zip(parallel, serial, strict=True):
        if ours.error is None:
            assert ours.breakdown.steps["step_ms"].tolist() == pytest.approx([11.0, 10.0])
            pd.testing.assert_frame_equal(ours.breakdown.replicas, theirs.breakdown.replicas)
            pd.testing.assert_frame_equal(ours.breakdown.steps, theirs.breakdown.steps)
    # Worker 2's extra kernel (0.8 ms on GPU 0 in step 2) is compute: 0.4 ms on average.
    extra = parallel[3].breakdown.steps["compute_ms"] - parallel[0].breakdown.steps["compute_ms"]
    assert extra.tolist() == pytest.approx([0.0, 0.4])


def test_a_process_that_dies_fails_only_its_trace(worker_traces, monkeypatch):
    """A trace whose analysis kills its process is that trace's RuntimeError; the
    other process goes on and analyses the rest."""
    from keras_dp_tools.analysis import runner

    paths, _ = worker_traces
    killer = paths[0].with_name("kills.xplane.pb")
    killer.write_bytes(paths[0].read_bytes())
    # The children run the runner's main: a sitecustomize on their path kills the one
    # that opens the killer trace (as the kernel's OOM killer would).
    site = killer.parent / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(
        "import os, builtins\n"
        "_open = builtins.open\n"
        "def _dying_open(path, *args, **kwargs):\n"
        "    if str(path).endswith('kills.xplane.pb'):\n"
        "        os._exit(9)\n"
        "    return _open(path, *args, **kwargs)\n"
        "builtins.open = _dying_open\n"
    )
    environment = runner._child_env()
    environment["PYTHONPATH"] = f"{site}:{environment['PYTHONPATH']}"
    monkeypatch.setattr(runner, "_child_env", lambda: environment)
    done = analyze_windows([(killer, None), *((p, None) for p in paths)], 2, xprof=False)
    assert isinstance(done[0].error, RuntimeError), done[0].error
    assert "exited with status 9" in str(done[0].error) and "kills.xplane.pb" in str(done[0].error)
    assert [w.error for w in done[1:]] == [None, None, None]
    assert all(len(w.breakdown.steps) == 2 for w in done[1:])


def test_the_summary_counts_a_step_once_however_many_workers_profiled_it(tmp_path):
    """Worker 0 profiled steps 10-12 (compute 8 ms of 10), workers 1-3 step 10 alone
    (compute 2 ms). Per step, the mean of its rows: step 10 (8 + 3 x 2) / 4 = 3.5,
    steps 11 and 12: 8; the median over the three steps is 8 (the median of the six
    rows, each step once per worker, would be 5)."""
    import keras_dp_tools as kdt
    from tests.helpers.recorded_runs import BALANCED, write_run

    write_run(tmp_path / "w0", worker=0, profiled=range(10, 13), breakdown=BALANCED)
    for worker in (1, 2, 3):
        light = {**BALANCED, "compute_ms": 2.0}
        write_run(tmp_path / f"w{worker}", worker=worker, profiled=range(10, 11), breakdown=light)
    summary = kdt.Report.load(tmp_path).summary()
    assert summary["compute_ms"].tolist() == pytest.approx([8.0])


def test_the_docs_example_puts_the_workers_rows_side_by_side(tmp_path):
    """docs/breakdown.md's example, on three workers' two_gpu_run traces, worker 1's with
    a kernel more on GPU 0 in step 2 (0.8 ms: 0.4 ms more compute on average over its
    two GPUs); steps 1 and 2 otherwise alike on every worker."""
    from tests.helpers.doc_blocks import python_block, run_example
    from tests.helpers.gpu_traces import GpuTrace, two_gpu_run

    for worker in range(3):
        trace = two_gpu_run(GpuTrace)
        if worker == 1:
            trace.kernel(0, 13, "void more(float*)", 18.0, 18.8, 130, launched_at=10.25)
        trace.space  # noqa: B018 (sorts the lines)
        path = tmp_path / "runs" / "job" / f"worker-{worker}" / "host.xplane.pb"
        path.parent.mkdir(parents=True)
        path.write_bytes(trace.space.SerializeToString())
    code = python_block("docs/breakdown.md", "### Every worker's trace of a window")
    lines = [line.split() for line in run_example(code, tmp_path).strip().splitlines()]
    assert lines[0] == ["worker", "0", "1", "2"]
    compute = {int(row[0]): [float(value) for value in row[1:]] for row in lines[2:]}
    assert sorted(compute) == [1, 2]
    step_1, step_2 = compute[1], compute[2]
    assert step_1[0] == step_1[1] == step_1[2]
    assert step_2[0] == step_2[2] and step_2[1] - step_2[0] == pytest.approx(0.4)


def test_keras_dp_analyze_with_jobs_skips_a_torn_trace_and_prints_the_others(
    worker_traces, tmp_path, capsys
):
    """``keras-dp analyze DIR --jobs 2``: every trace's rows (two_gpu_run's steps 1 and
    2, 11 and 10 ms), each trace's progress, and the torn one skipped, named."""
    import shutil

    from keras_dp_tools.tools.cli import main

    paths, torn = worker_traces
    for index, path in enumerate([paths[0], paths[1], torn]):
        capture = tmp_path / "log" / f"w{index}" / "plugins" / "profile" / "2026_01_01_00_00_00"
        capture.mkdir(parents=True)
        shutil.copy(path, capture / "host.xplane.pb")
    assert main(["analyze", str(tmp_path / "log"), "--jobs", "2", "--csv"]) == 0
    out, err = capsys.readouterr()
    rows = pd.read_csv(io.StringIO(out))
    assert rows.groupby("trace")["step_ms"].apply(list).tolist() == [[11.0, 10.0]] * 2
    assert err.count("analysing: ") == 3 and "(3/3)" in err
    assert f"skipped {tmp_path / 'log' / 'w2'}" in err
