"""What the analysis must not get wrong quietly: callers that own their process hand
freed memory back, and a step marker that cannot be true leaves its step empty with the
reason rather than a plausible figure. Traces are built by hand with the real schema."""

import pickle
import sys

import pytest

from keras_dp_tools.analysis import analyze_trace, breakdown
from tests.xplane_builder import SpaceBuilder


@pytest.fixture(scope="module")
def builder(tf):  # the proto classes ship with TensorFlow
    return SpaceBuilder


def small_cpu_trace(builder, tmp_path):
    """Two 8 ms steps, each with 4 ms of compute."""
    space = builder()
    for step, start in ((1, 0.0), (2, 10.0)):
        space.step(step, start, start + 8.0)
        space.host().event("tf_Compute/1", "sequential/dense/MatMul:MatMul", start + 1, start + 5)
    return space.write(tmp_path)


@pytest.fixture
def trims(monkeypatch):
    """Calls of glibc's ``malloc_trim`` made by the analysis: the real function, wrapped
    to count its calls (and still trim)."""
    real = breakdown._malloc_trim()
    if real is None:
        pytest.skip("no glibc malloc_trim here: release_memory has no effect to observe")
    calls = []

    def counting(pad):
        calls.append(pad)
        return real(pad)

    monkeypatch.setattr(breakdown, "_malloc_trim", lambda: counting)
    return calls


def test_an_analysis_in_a_thread_beside_training_does_not_trim(builder, tmp_path, trims):
    """The default (the profiler's thread inside training) leaves the heap alone, so a
    count of trims tells the callers below apart."""
    analyze_trace(small_cpu_trace(builder, tmp_path))
    assert trims == []


def test_keras_dp_analyze_hands_freed_memory_back(builder, tmp_path, trims, monkeypatch):
    """``keras-dp analyze`` has its process to itself: its analysis trims the heap (run
    here, so that the wrapped trim sees the calls)."""
    from keras_dp_tools.cli import main

    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")  # what the command sets: undone after

    assert main(["analyze", str(small_cpu_trace(builder, tmp_path)), "--csv"]) == 0
    assert trims, "keras-dp analyze no longer passes release_memory=True"


def test_the_profilers_child_analysis_hands_freed_memory_back(
    builder, tmp_path, trims, monkeypatch
):
    """The child process the profiler starts for large traces runs ``_CHILD``: run here
    (same script, same arguments), so that the wrapped trim sees its calls."""
    from keras_dp_tools.capture import data_parallel_profiler

    trace = small_cpu_trace(builder, tmp_path)
    request, answer = tmp_path / "request.pkl", tmp_path / "answer.pkl"
    request.write_bytes(pickle.dumps((str(trace), {"allreduce_bytes": 64})))
    monkeypatch.setattr(sys, "argv", ["-c", str(request), str(answer)])
    exec(data_parallel_profiler._CHILD % 0, {"__name__": "__main__"})  # nice(0): no change
    result, _ = pickle.loads(answer.read_bytes())
    assert not isinstance(result, BaseException), result
    assert result.steps["step_ms"].tolist() == pytest.approx([8.0, 8.0])
    assert trims, "the profiler's child analysis no longer passes release_memory=True"


def three_step_trace(builder, middle_end_ms: float, capture_ms: float | None = 40.0):
    """Steps 1-3 marked at 0, 10 and 20 ms, 8 ms each (the middle one ending at
    ``middle_end_ms`` instead of 18), each with an input wait 0-0.5 and compute 1-5 ms
    into it; with a ``Task Environment`` plane saying the capture lasted ``capture_ms``
    from the lines' start, as every TF 2.21 capture made here does."""
    space = builder()
    for step, start in ((1, 0.0), (2, 10.0), (3, 20.0)):
        space.step(step, start, middle_end_ms if step == 2 else start + 8.0)
        host = space.host()
        host.event(
            "tf_data_iterator_get_next/1", "IteratorGetNextOp::DoCompute", start, start + 0.5
        )
        host.event("tf_Compute/1", "sequential/dense/MatMul:MatMul", start + 1, start + 5)
    if capture_ms is not None:
        from tests.xplane_builder import LINE_START_NS

        environment = space.plane("Task Environment")
        for name, ns in (
            ("profile_start_time", LINE_START_NS),
            ("profile_stop_time", LINE_START_NS + round(capture_ms * 1e6)),
        ):
            environment.plane.stats.add(metadata_id=environment._stat_id(name), uint64_value=ns)
    return space


MEASURED = {"step_ms": 8.0, "compute_ms": 4.0, "input_ms": 0.5, "other_ms": 3.5}
TIMES = ["step_ms", "compute_ms", "allreduce_ms", "input_ms", "other_ms", "dispatch_ms"]


def test_a_marker_outlasting_the_capture_leaves_its_step_empty_with_the_reason(builder, tmp_path):
    """The middle marker lasts 10**15 ps (1000 s) in a 40 ms capture: the profiler keeps
    only events that ended before it stopped, so that duration is not the step's. Its
    row stays, empty, saying why; steps 1 and 3 keep their hand-computed numbers (the
    broken marker, which covers step 3, takes nothing from it)."""
    path = three_step_trace(builder, 10.0 + 1e15 / 1e9).write(tmp_path)
    result = analyze_trace(path)
    steps = result.steps.set_index("step")
    for step in (1, 3):
        assert steps.loc[step, list(MEASURED)].tolist() == pytest.approx(list(MEASURED.values()))
    assert steps.loc[2, TIMES].isna().all(), steps.loc[2, TIMES]
    note = steps.loc[2, "bandwidth_note"]
    # Ends at 10 ms + 1000 s; the capture ran 40 ms from the first event (at 0).
    assert note.startswith("not measured: its marker ends 999.97 s after the capture stopped")
    assert "(the capture lasted 0.04 s)" in note
    replicas = result.replicas.set_index("step")
    assert replicas.loc[2, TIMES].isna().all() and replicas.loc[2, "bandwidth_note"] == note
    assert replicas.loc[3, "step_ms"] == pytest.approx(8.0)
    assert result.unmeasured == f"step 2 {note}"


def test_overlapping_markers_on_one_thread_leave_both_steps_empty(builder, tmp_path):
    """Without the capture's stop time, the middle marker (10-25 ms) overlapping step 3's
    (20-28) on the same thread tells only that one of the two is wrong: both are left
    empty, step 1 is measured."""
    path = three_step_trace(builder, 25.0, capture_ms=None).write(tmp_path)
    result = analyze_trace(path)
    steps = result.steps.set_index("step")
    assert steps.loc[1, list(MEASURED)].tolist() == pytest.approx(list(MEASURED.values()))
    assert steps.loc[[2, 3], TIMES].isna().all().all()
    assert "overlaps step 3's on thread 'python'" in steps.loc[2, "bandwidth_note"]
    assert "overlaps step 2's on thread 'python'" in steps.loc[3, "bandwidth_note"]
    assert result.unmeasured.startswith("step 2 not measured") and "; step 3 " in result.unmeasured


def test_keras_dp_analyze_says_which_step_was_not_measured(builder, tmp_path, capsys, monkeypatch):
    from keras_dp_tools.cli import main

    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")  # what the command sets: undone after

    trace = three_step_trace(builder, 10.0 + 1e15 / 1e9).write(tmp_path)
    assert main(["analyze", str(trace), "--csv"]) == 0
    out, err = capsys.readouterr()
    assert "step 2 not measured: its marker ends 999.97 s after the capture stopped" in err
    rows = {line.split(",")[0]: line for line in out.splitlines()[1:]}
    assert rows["2"].startswith("2,1,1,,,") and ",8.0," in rows["3"]


def test_a_true_trace_has_every_step_measured(builder, tmp_path):
    """The same trace with sound markers, inside its capture: nothing left out."""
    result = analyze_trace(three_step_trace(builder, 18.0).write(tmp_path))
    assert result.unmeasured is None
    assert result.steps["step_ms"].tolist() == pytest.approx([8.0, 8.0, 8.0])
    assert not result.steps["bandwidth_note"].fillna("").str.startswith("not measured").any()


def test_the_profilers_window_record_says_which_step_was_not_measured(builder, tmp_path):
    """What the profiler writes for such a window, through the real recorder and
    records reader: the window is analysed with the two true steps, its ``reason``
    names step 2 and why, and step 2's record has empty numbers (JSON null)."""
    from types import SimpleNamespace

    from keras_dp_tools.capture.data_parallel_profiler import DataParallelProfiler
    from keras_dp_tools.capture.recorder import Recorder
    from keras_dp_tools.records import read_records_by_type

    trace = three_step_trace(builder, 10.0 + 1e15 / 1e9).write(tmp_path / "capture")
    result = analyze_trace(trace)
    recorder = Recorder.acquire(tmp_path, 0)
    try:
        recorder.start_run({"strategy": "MirroredStrategy", "replicas": 1})
        profiler = SimpleNamespace(_recorder=recorder, tensorboard=False)
        profiler._write_window = DataParallelProfiler._write_window.__get__(profiler)
        record = {"time": 1.0, "window": 0, "start_step": 1, "end_step": 4, "trace": str(trace)}
        DataParallelProfiler._write_breakdown(profiler, record, result)
    finally:
        recorder.release()
    records = read_records_by_type(recorder.records_path)
    window = records["window"].iloc[0]
    assert window["status"] == "analysed" and window["steps_analysed"] == 2
    assert window["reason"] == result.unmeasured and window["reason"].startswith("step 2 ")
    steps = records["step_breakdown"].set_index("step")
    assert steps.loc[2, TIMES].isna().all() and steps.loc[3, "step_ms"] == pytest.approx(8.0)


def test_on_gpus_an_untrue_marker_keeps_its_kernels_and_xprofs_steps_out(builder, tmp_path):
    """Two GPUs, steps at 0, 10 and 20 ms (the middle marker 1000 s long), each launching
    a gemm (1-5 ms into the step) and an NCCL all-reduce (GPU 0 from 5, GPU 1 from 6, to
    7): steps 1 and 3 have compute 4, all-reduce (2 + 1) / 2 and a wait of (1 + 0) / 2.
    Step 2's kernels stay with step 2's (empty) row, not step 3's. XProf groups steps by
    the same markers (here its second step ran 16 ms: steps 2 and 3 merged), so its
    columns are left out of the trace."""
    from tests.gpu_traces import GpuTrace
    from tests.xplane_builder import LINE_START_NS

    trace = GpuTrace()
    for step, start in ((1, 0.0), (2, 10.0), (3, 20.0)):
        trace.step(step, start, 10.0 + 1e15 / 1e9 if step == 2 else start + 8.0)
        for gpu in (0, 1):
            first = step * 100 + gpu * 10
            trace.kernel(gpu, 13, "volta_sgemm_128x64_nn", start + 1, start + 5, first, start + 0.2)
            nccl = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
            trace.kernel(gpu, 20, nccl, start + 5 + gpu, start + 7, first + 1, start + 0.3)
    environment = trace.builder.plane("Task Environment")
    for name, ns in (
        ("profile_start_time", LINE_START_NS),
        ("profile_stop_time", LINE_START_NS + 40 * 10**6),
    ):
        environment.plane.stats.add(metadata_id=environment._stat_id(name), uint64_value=ns)
    result = analyze_trace(trace.write(tmp_path), devices=["/gpu:0", "/gpu:1"])
    steps = result.steps.set_index("step")
    expected = {"step_ms": 8.0, "compute_ms": 4.0, "allreduce_ms": 1.5, "sync_wait_ms": 0.5}
    for step in (1, 3):
        assert steps.loc[step, list(expected)].tolist() == pytest.approx(list(expected.values()))
    assert steps.loc[2, TIMES].isna().all()
    assert steps[["xprof_step_ms", "xprof_collectives_ms"]].isna().all().all()
    assert result.unmeasured.startswith("step 2 not measured") and "XProf" in result.unmeasured
