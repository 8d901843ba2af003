"""Captures made without our markers: where the steps come from (``step_sources``), the
devices rows name, the GPUs that are not replicas, and the run facts nobody gave.

Traces are XSpace protos as the profiler writes them (``tests/helpers``); expected
values are computed by hand in the docstrings, and on GPU traces XProf's own step
grouping on the same file is the second opinion."""

import pytest

from keras_dp_tools.analysis import analyze_trace, analyze_xspace
from tests.helpers.consistency import breakdown_problems
from tests.helpers.xplane_builder import Uint


def steps_of(breakdown):
    assert breakdown_problems(breakdown.replicas) == []
    return breakdown.steps.set_index("step")


def function_call(host, start, end, work=None, line="python"):
    """One tf.function call as TF 2.21 records it: a root ``FunctionRun`` on the
    calling thread and the executor's work (``work``: its start and end; default just
    inside the call) on a compute thread, in the call's context (``_p``/``_pt`` of the
    call are ``_c``/``_ct`` of the work; ids are random uint64s)."""
    context = 13219020320256177691 + round(start * 1000)
    host.event(line, "FunctionRun", start, end, _r=1, _pt=2, _p=Uint(context))
    first, last = work or (start + 0.1, end - 0.1)
    worker = "tf_data_iterator_resource/7" if line.startswith("tf_data") else "tf_Compute/1"
    host.event(worker, "ExecutorState::Process", first, last, iter_num=0, _ct=2, _c=Uint(context))


def test_keras3_tensorboard_batches_are_the_steps(builder):
    """Keras 3's TensorBoard marks profiled batches ``Profiled batch`` (no ``_r``).
    Batches 2 (0-4 ms, a 1-3 ms op) and 3 (5-8 ms, a 6-7 ms op)."""
    space = builder()
    host = space.host()
    host.event("python", "Profiled batch", 0, 4, step_num=2)
    host.event("python", "Profiled batch", 5, 8, step_num=3)
    host.event("tf_Compute/1", "sequential/dense/MatMul:_MklMatMul", 1, 3)
    host.event("tf_Compute/1", "sequential/dense/MatMul:_MklMatMul", 6, 7)
    breakdown = analyze_xspace(space.space)
    steps = steps_of(breakdown)
    assert breakdown.step_source == "profiled_batch"
    assert list(steps.index) == [2, 3]
    assert steps["step_ms"].tolist() == pytest.approx([4.0, 3.0])
    assert steps["compute_ms"].tolist() == pytest.approx([2.0, 1.0])
    assert set(breakdown.replicas["step_source"]) == {"profiled_batch"}
    assert breakdown.replicas["device"].tolist() == ["/host:CPU", "/host:CPU"]


def test_markers_win_in_order_ours_train_then_profiled_batch(builder):
    """tf_keras's ``train`` markers (0-4, 5-8) win over Keras 3's batches (0-2), and
    ours (0-10) over both."""
    space = builder()
    host = space.host()
    host.event("python", "Profiled batch", 0, 2, step_num=7)
    space.step(1, 0, 4, own=False).step(2, 5, 8, own=False)
    host.event("tf_Compute/1", "sequential/dense/MatMul:_MklMatMul", 1, 3)
    breakdown = analyze_xspace(space.space)
    assert breakdown.step_source == "train_marker"
    assert list(steps_of(breakdown).index) == [1, 2]
    space.step(9, 0, 10)
    breakdown = analyze_xspace(space.space)
    assert breakdown.step_source == "kdp_marker"
    assert steps_of(breakdown)["step_ms"].tolist() == pytest.approx([10.0])


def test_function_calls_are_steps_as_xprof_groups_them(builder):
    """Without markers, each root ``FunctionRun`` that ran executor work in its context
    is a step, numbered in time order: 0-4 ms, and 10-15 ms (a call of 10-10.1 ms whose
    work ran 10.5-15 ms, after it returned, as seen on a loaded machine). Not steps: a
    root nested in another on its thread (1-2 ms), one on a tf.data thread (5-6 ms), one
    whose context ran no executor work (20-21 ms)."""
    space = builder()
    host = space.host()
    function_call(host, 0, 4)
    function_call(host, 1, 2, work=(1.2, 1.8))  # nested: part of the outer call
    function_call(host, 5, 6, line="tf_data_iterator_resource/7")
    function_call(host, 10, 10.1, work=(10.5, 15))
    host.event("python", "FunctionRun", 20, 21, _r=1, _pt=2, _p=Uint(5))  # no work
    host.event("tf_Compute/1", "sequential/dense/MatMul:_MklMatMul", 1, 2.5)
    host.event("tf_Compute/1", "sequential/dense/MatMul:_MklMatMul", 11, 12)
    breakdown = analyze_xspace(space.space)
    steps = steps_of(breakdown)
    assert breakdown.step_source == "function_run"
    assert list(steps.index) == [0, 1]
    assert steps["step_ms"].tolist() == pytest.approx([4.0, 5.0])
    assert steps["compute_ms"].tolist() == pytest.approx([1.5, 1.0])


def test_loop_iterations_are_steps(builder):
    """A function looping 3 times (``step_id`` 5, ``iter_num`` 0-2, each 3 ms from 0,
    3, 6) has a step per iteration; a one-off function (``step_id`` 6) is no loop."""
    space = builder()
    host = space.host()
    host.event("python", "FunctionRun", 0, 10, _r=1)
    for iteration in range(3):
        start = 3.0 * iteration
        host.event(
            "tf_Compute/1",
            "ExecutorState::Process",
            start,
            start + 2.5,
            step_id=5,
            iter_num=iteration,
        )
    host.event("tf_Compute/2", "ExecutorState::Process", 0, 1, step_id=6, iter_num=0)
    breakdown = analyze_xspace(space.space)
    assert breakdown.step_source == "iter_num"
    assert steps_of(breakdown)["step_ms"].tolist() == pytest.approx([2.5, 2.5, 2.5])


def test_group_ids_written_with_the_capture_are_the_steps(builder):
    """Older TensorFlow grouped events before saving: ``group_id`` 4 spans 0-3 ms
    (two executor events), ``group_id`` 5 spans 4-6 ms."""
    space = builder()
    host = space.host()
    host.event("tf_Compute/1", "ExecutorState::Process", 0, 2, group_id=4, iter_num=0)
    host.event("tf_Compute/2", "ExecutorState::Process", 1, 3, group_id=4, iter_num=0)
    host.event("tf_Compute/1", "ExecutorState::Process", 4, 6, group_id=5, iter_num=0)
    breakdown = analyze_xspace(space.space)
    steps = steps_of(breakdown)
    assert breakdown.step_source == "group_id"
    assert list(steps.index) == [4, 5]
    assert steps["step_ms"].tolist() == pytest.approx([3.0, 2.0])


def test_nothing_to_group_by_gives_the_whole_capture_as_one_step(builder):
    """Host events from 1 to 9 ms and nothing to find steps by: one step 0 of 8 ms."""
    space = builder()
    host = space.host()
    host.event("tf_Compute/1", "sequential/dense/MatMul:_MklMatMul", 1, 3)
    host.event("python", "something", 2, 9)
    breakdown = analyze_xspace(space.space)
    steps = steps_of(breakdown)
    assert breakdown.step_source == "whole_capture"
    assert list(steps.index) == [0]
    assert steps.loc[0, "step_ms"] == pytest.approx(8.0)
    assert steps.loc[0, "compute_ms"] == pytest.approx(2.0)


def test_a_log_dir_of_captures_alone_points_report_at_analyze(builder, tmp_path):
    """``Report`` reads records; on a log dir that holds only captures, its error says
    how to break them down instead."""
    import keras_dp_tools as kdt

    space = builder()
    space.host().event("python", "Profiled batch", 0, 4, step_num=2)
    space.write(tmp_path / "train")
    with pytest.raises(FileNotFoundError, match=r"1 profiler capture\(s\): `keras-dp analyze"):
        kdt.Report.load(tmp_path)


def foreign_gpu_capture(gpu_trace):
    """A 3-GPU capture of a model on GPU 0 alone, made without markers: two calls (python
    ``FunctionRun`` 0-4 and 10-14 ms) launch kernels on GPU 0 (1-6, 6-8 and 11-15 ms);
    GPU 1 only receives host-to-device copies (0.2-0.5 and 10.2-10.4 ms); GPU 2 runs
    nothing (a derived line only)."""
    trace = gpu_trace()
    host = trace.builder.host()
    for start, end in ((0, 4), (10, 14)):
        function_call(host, start, end)
    trace.kernel(0, 13, "volta_sgemm_128x64_nn", 1, 6, correlation_id=11, launched_at=0.5)
    trace.kernel(0, 13, "adam_kernel", 6, 8, correlation_id=12, launched_at=3.5)
    trace.kernel(0, 13, "volta_sgemm_128x64_nn", 11, 15, correlation_id=21, launched_at=10.5)
    trace.copy(1, 14, "H2D", 0.2, 0.5, correlation_id=13, launched_at=0.1)
    trace.copy(1, 14, "H2D", 10.2, 10.4, correlation_id=22, launched_at=10.1)
    trace.derived_line(2, "fusion", 1, 2)
    return trace


def test_a_gpu_that_ran_no_model_kernel_is_listed_apart_and_xprof_agrees(gpu_trace, tmp_path):
    """Steps: call 1 lasts until its last kernel ends (0-8 ms), call 2 until 15 ms
    (10-15). GPU 0 computes [1,8] = 7 ms and [11,15] = 4 ms; the time before the first
    kernel (1 ms each) is dispatch. XProf groups the same calls (its implicit roots,
    without a host step marker) and times a step by its device events alone: 7 and
    4 ms, our step less its dispatch, with the same device compute."""
    path = foreign_gpu_capture(gpu_trace).write(tmp_path)
    breakdown = analyze_trace(path, xprof=True)
    steps = steps_of(breakdown)
    assert breakdown.step_source == "function_run"
    assert steps["replicas"].tolist() == [1, 1]
    assert set(breakdown.replicas["device"]) == {"/device:GPU:0"}
    assert steps["step_ms"].tolist() == pytest.approx([8.0, 5.0])
    assert steps["compute_ms"].tolist() == pytest.approx([7.0, 4.0])
    apart = breakdown.devices_apart.set_index("device")
    assert list(apart.index) == ["/device:GPU:1", "/device:GPU:2"]
    assert apart.loc["/device:GPU:1", "did"] == "2 host-to-device copies"
    assert apart.loc["/device:GPU:1", "busy_ms"] == pytest.approx(0.5)
    assert apart.loc["/device:GPU:2", "did"] == "nothing"
    assert steps["dispatch_ms"].tolist() == pytest.approx([1.0, 1.0])
    assert steps["xprof_step_ms"].tolist() == pytest.approx([7.0, 4.0])
    assert steps["xprof_device_compute_ms"].tolist() == pytest.approx([7.0, 4.0])


def test_device_events_grouped_with_the_capture_join_their_group_step(gpu_trace):
    """The layout of a real multi-worker GPU capture of TF 2.4 (tensorflow/profiler's
    demo, benchmarks/gpu_captures.md): events carry ``group_id``, no host launch is
    recorded, and a GPU may run its share after the host's group ended. Group 0 (a
    python call, executor work 0-10 ms) is the step; group 1 (tf.data's call) is not.
    GPU 0 runs group 0's kernels at 2-4 ms, GPU 1 at 12-14 ms: both count in step 0,
    which lasts 0-14 ms."""
    trace = gpu_trace()
    host = trace.builder.host()
    host.event("python3", "FunctionRun", 0, 0.5, group_id=0)
    host.event("tf_Compute/1", "ExecutorState::Process", 0.2, 10, group_id=0, iter_num=0)
    host.event("tf_data_iterator_resource/3", "FunctionRun", 5, 6, group_id=1)
    host.event("tf_Compute/2", "ExecutorState::Process", 5.1, 5.9, group_id=1, iter_num=0)
    for gpu, start in ((0, 2), (1, 12)):
        plane = trace.builder.gpu(gpu)
        plane.line("Stream #13(Compute)", line_id=13)
        plane.event("Stream #13(Compute)", "volta_sgemm_128x64_nn", start, start + 2, group_id=0)
    breakdown = analyze_xspace(trace.space)
    steps = steps_of(breakdown)
    assert breakdown.step_source == "group_id"
    assert list(steps.index) == [0]
    assert steps.loc[0, "step_ms"] == pytest.approx(14.0)
    assert breakdown.replicas["compute_ms"].tolist() == pytest.approx([2.0, 2.0])
    assert breakdown.replicas["device"].tolist() == ["/device:GPU:0", "/device:GPU:1"]


def test_run_facts_nobody_gave_are_named_not_guessed(gpu_trace):
    """Two GPUs and no facts: the gradient bytes, replicas in sync and devices are
    named as unknown; given, nothing is."""
    trace = gpu_trace()
    host = trace.builder.host()
    function_call(host, 0, 4)
    trace.kernel(0, 13, "volta_sgemm_128x64_nn", 1, 3, correlation_id=1, launched_at=0.5)
    trace.kernel(1, 13, "volta_sgemm_128x64_nn", 1, 3, correlation_id=2, launched_at=0.6)
    breakdown = analyze_xspace(trace.space)
    assert "gradient bytes" in breakdown.unknown
    assert "replicas in sync" in breakdown.unknown
    assert "devices" in breakdown.unknown
    assert breakdown.replicas["bandwidth_note"].notna().all()
    given = analyze_xspace(
        trace.space, allreduce_bytes=1000, replicas_in_sync=2, devices=["/gpu:0", "/gpu:1"]
    )
    assert given.unknown is None
    assert given.replicas["device"].tolist() == ["/gpu:0", "/gpu:1"]


def test_analyze_takes_the_facts_a_capture_cannot_know(gpu_trace, tmp_path, capsys):
    """``keras-dp analyze`` names what nobody gave on stderr; ``--allreduce-bytes``,
    ``--replicas-in-sync`` and ``--devices`` give it, and the rows then carry it."""
    trace = gpu_trace()
    host = trace.builder.host()
    function_call(host, 0, 4)
    trace.kernel(0, 13, "volta_sgemm_128x64_nn", 1, 3, correlation_id=1, launched_at=0.5)
    trace.kernel(1, 13, "volta_sgemm_128x64_nn", 1, 3, correlation_id=2, launched_at=0.6)
    trace.write(tmp_path)
    rows, notes = analyze_command(tmp_path, capsys, "--per-replica")
    assert "unknown: gradient bytes" in notes and "replicas in sync" in notes
    assert [row["device"] for row in rows] == ["/device:GPU:0", "/device:GPU:1"]
    assert {row["bandwidth_note"] for row in rows} == {
        "all-reduce bytes unknown (pass allreduce_bytes)"
    }
    given = ("--allreduce-bytes", "1000", "--replicas-in-sync", "4", "--devices", "/gpu:0,/gpu:1")
    rows, notes = analyze_command(tmp_path, capsys, "--per-replica", *given)
    assert "unknown" not in notes
    assert [row["device"] for row in rows] == ["/gpu:0", "/gpu:1"]
    # The bytes are known now; this step ran no all-reduce to divide them by.
    assert {row["bandwidth_note"] for row in rows} == {"no all-reduce collective ran in this step"}


# Captures made here as users make them (tests/helpers/foreign_capture.py), read by
# ``keras-dp analyze`` and, on the same files, by XProf (one folder per capture).


def capture(kind, log_dir):
    """Runs ``tests.helpers.foreign_capture`` in a process of its own."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "TF_CPP_MIN_LOG_LEVEL": "2"}
    command = [sys.executable, "-m", "tests.helpers.foreign_capture", kind, str(log_dir)]
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def analyze_command(source, capsys, *options):
    """``keras-dp analyze SOURCE --format json``: the rows, and stderr's notes."""
    import json

    from keras_dp_tools.tools.cli import main

    capsys.readouterr()
    assert main(["analyze", str(source), "--format", "json", "--jobs", "1", *options]) == 0
    out, err = capsys.readouterr()
    return json.loads(out), err


def only_trace(folder):
    from keras_dp_tools.analysis import find_traces

    (trace,) = find_traces(folder)
    return trace


@pytest.mark.slow
def test_keras3_tensorboard_and_a_bare_profiler_capture(tmp_path, capsys, monkeypatch):
    """Keras 3's ``TensorBoard(profile_batch=(3, 6))`` profiles the 3rd to 6th batches
    (``step_num`` 2-5, the batch in the epoch). XProf lists no step for such a CPU capture
    (no ``_r`` on its markers, keras-team/keras#19476); we find the four. A bare
    ``tf.profiler`` capture around 8 calls of a custom ``tf.function`` step gives 8
    steps, one per call (XProf's grouping by ``FunctionRun``; it lists no step on CPU
    either: a call is an implicit root, which names no step)."""
    from keras_dp_tools.analysis.breakdown.xprof_steps import xprof_step_table
    from tests.helpers.foreign_capture import CALLS, PROFILE_BATCH

    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    capture("keras3", tmp_path)
    rows, notes = analyze_command(tmp_path / "train", capsys, "--allreduce-bytes", "1000")
    first, last = PROFILE_BATCH
    assert [row["step"] for row in rows] == list(range(first - 1, last))
    assert {row["step_source"] for row in rows} == {"profiled_batch"}
    assert all(0 < row["compute_ms"] < row["step_ms"] for row in rows)
    assert "Keras 3 TensorBoard" in notes
    assert xprof_step_table(only_trace(tmp_path / "train")).empty
    rows, notes = analyze_command(tmp_path / "bare", capsys)
    assert [row["step"] for row in rows] == list(range(CALLS))
    assert {row["step_source"] for row in rows} == {"function_run"}
    assert {row["replicas"] for row in rows} == {1}
    assert all(0 < row["compute_ms"] < row["step_ms"] for row in rows)
    assert "one step per tf.function call" in notes
    assert xprof_step_table(only_trace(tmp_path / "bare")).empty


@pytest.mark.slow
def test_tf_keras_tensorboard_capture_matches_xprofs_steps(tmp_path, capsys, monkeypatch):
    """tf_keras marks every step ``Trace("train", step_num=<batch in the epoch>, _r=1)``,
    which XProf takes as its steps too: the same steps, and the same step times (both
    are the marker's length) to 1%."""
    from keras_dp_tools.analysis.breakdown.xprof_steps import xprof_step_table

    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    capture("tf_keras", tmp_path)
    rows, _ = analyze_command(tmp_path, capsys)
    assert {row["step_source"] for row in rows} == {"train_marker"}
    replica_rows, _ = analyze_command(tmp_path, capsys, "--per-replica")
    assert {row["device"] for row in replica_rows} == {"/host:CPU"}
    xprof = xprof_step_table(only_trace(tmp_path)).set_index("step")
    assert [row["step"] for row in rows] == list(xprof.index)
    for row in rows:
        assert row["step_ms"] == pytest.approx(xprof.loc[row["step"], "xprof_step_ms"], rel=0.01)


@pytest.mark.slow
def test_a_bare_capture_of_mirrored_fit_has_a_step_per_all_reduce(tmp_path, capsys, monkeypatch):
    """Keras 3 ``fit`` under ``MirroredStrategy`` on 2 logical CPUs, in a bare profiler
    session: each train step is two ``FunctionRun`` calls whose work runs together,
    one step. The independent count: the capture's all-reduces, one
    ``CollectiveReduceV2`` per replica with the same peer key per step; every step we
    find holds one for both replicas (named by their replica). A step dispatched before
    the previous one's work ended joins it (step_sources; seen once in 128 steps on a
    loaded machine), so up to two of 16 may be joined, never split."""
    from collections import Counter

    from keras_dp_tools.analysis.trace.xspace import host_planes, load_xspace, plane_events
    from tests.helpers.foreign_capture import REPLICAS

    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    capture("mirrored", tmp_path)
    space = load_xspace(only_trace(tmp_path))
    peers = Counter(
        (event.stats.get("group_key"), event.stats.get("instance_key"), event.stats.get("step_id"))
        for plane in host_planes(space)
        for event in plane_events(plane)
        if event.name.endswith(":CollectiveReduceV2")
    )
    assert set(peers.values()) == {REPLICAS}
    rows, notes = analyze_command(tmp_path, capsys, "--per-replica")
    steps = sorted({row["step"] for row in rows})
    assert len(peers) - 2 <= len(steps) <= len(peers)
    assert {row["step_source"] for row in rows} == {"function_run"}
    assert {row["device"] for row in rows} == {f"/host:CPU replica {k}" for k in range(REPLICAS)}
    assert all(row["allreduce_ms"] > 0 for row in rows)
    assert "gradient bytes" in notes
