"""What the analysis must not get wrong quietly: callers that own their process hand
freed memory back, and a step marker that cannot be true leaves its step empty with the
reason rather than a plausible figure. Traces are built by hand with the real schema."""

import pickle
import sys

import pytest

from keras_dp_tools.analysis import analyze_trace
from keras_dp_tools.analysis.breakdown import memory, xprof_steps


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
    real = memory.malloc_trim()
    if real is None:
        pytest.skip("no glibc malloc_trim here: release_memory has no effect to observe")
    calls = []

    def counting(pad):
        calls.append(pad)
        return real(pad)

    monkeypatch.setattr(memory, "malloc_trim", lambda: counting)
    return calls


def test_an_analysis_in_a_thread_beside_training_does_not_trim(builder, tmp_path, trims):
    """The default (the profiler's thread inside training) leaves the heap alone, so a
    count of trims tells the callers below apart."""
    analyze_trace(small_cpu_trace(builder, tmp_path))
    assert trims == []


def test_keras_dp_analyze_hands_freed_memory_back(builder, tmp_path, trims, monkeypatch):
    """``keras-dp analyze`` has its process to itself: its analysis trims the heap (run
    here, so that the wrapped trim sees the calls)."""
    from keras_dp_tools.tools.cli import main

    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")  # what the command sets: undone after

    assert main(["analyze", str(small_cpu_trace(builder, tmp_path)), "--csv"]) == 0
    assert trims, "keras-dp analyze no longer passes release_memory=True"


def test_the_profilers_child_analysis_hands_freed_memory_back(
    builder, tmp_path, trims, monkeypatch
):
    """The child process the profiler starts for large traces runs the runner's
    ``main``: run here (same request), so that the wrapped trim sees its calls."""
    from keras_dp_tools.analysis import runner
    from keras_dp_tools.records.facts import RunFacts

    trace = small_cpu_trace(builder, tmp_path)
    request, answer = tmp_path / "request.pkl", tmp_path / "answer.pkl"
    nice = 0  # no change to this process's priority
    request.write_bytes(pickle.dumps((str(trace), RunFacts(allreduce_bytes=64), nice)))
    monkeypatch.setattr(sys, "argv", ["runner", str(request), str(answer)])
    runner.main()
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
        from tests.helpers.xplane_builder import LINE_START_NS

        environment = space.plane("Task Environment")
        for name, ns in (
            ("profile_start_time", LINE_START_NS),
            ("profile_stop_time", LINE_START_NS + round(capture_ms * 1e6)),
        ):
            environment.plane.stats.add(metadata_id=environment.stat_id(name), uint64_value=ns)
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
    assert result.unmeasured == (
        "step 2 not measured: the marker ends after the capture stopped (the capture lasted "
        "0.04 s), so its duration is not the step's"
    )


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
    assert result.unmeasured == (
        "steps 2-3 not measured: the marker overlaps another step's on its thread, where "
        "markers follow one another"
    )


def test_keras_dp_analyze_says_which_step_was_not_measured(builder, tmp_path, capsys, monkeypatch):
    from keras_dp_tools.tools.cli import main

    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")  # what the command sets: undone after

    trace = three_step_trace(builder, 10.0 + 1e15 / 1e9).write(tmp_path)
    assert main(["analyze", str(trace), "--csv"]) == 0
    out, err = capsys.readouterr()
    assert "step 2 not measured: the marker ends after the capture stopped" in err
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
    from keras_dp_tools.records.reader import read_records_by_type

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
    from tests.helpers.gpu_traces import GpuTrace
    from tests.helpers.xplane_builder import LINE_START_NS

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
        environment.plane.stats.add(metadata_id=environment.stat_id(name), uint64_value=ns)
    result = analyze_trace(trace.write(tmp_path), devices=["/gpu:0", "/gpu:1"])
    steps = result.steps.set_index("step")
    expected = {"step_ms": 8.0, "compute_ms": 4.0, "allreduce_ms": 1.5, "sync_wait_ms": 0.5}
    for step in (1, 3):
        assert steps.loc[step, list(expected)].tolist() == pytest.approx(list(expected.values()))
    assert steps.loc[2, TIMES].isna().all()
    assert steps[["xprof_step_ms", "xprof_collectives_ms"]].isna().all().all()
    assert result.unmeasured.startswith("step 2 not measured") and "XProf" in result.unmeasured


def add_capture_length(space, capture_ms: float) -> None:
    """A ``Task Environment`` plane saying the capture lasted ``capture_ms`` (absolute
    nanoseconds, as TF 2.21 writes them)."""
    from tests.helpers.xplane_builder import LINE_START_NS

    environment = space.plane("Task Environment")
    for name, ns in (
        ("profile_start_time", LINE_START_NS),
        ("profile_stop_time", LINE_START_NS + round(capture_ms * 1e6)),
    ):
        environment.plane.stats.add(metadata_id=environment.stat_id(name), uint64_value=ns)


def name_lines(space, old: str, new: str) -> None:
    """Gives the host lines named ``old`` the name ``new`` (their ids stay): every
    Python thread's line is named "python"."""
    for line in space.host().plane.lines:
        if line.name == old:
            line.name = new


def marker(space, line: str, step: int, start: float, end: float) -> None:
    """Our profiler's step marker on the host line ``line``."""
    space.host().event(line, "train", start, end, step_num=step, _r=1, kdp=1)


def test_two_profilers_in_one_fit_mark_each_step_once(builder, tmp_path):
    """Two DataParallelProfilers in one Keras 3 fit each mark every step, in callback
    order: profiler 1's marker (0-8 ms into the step) crosses profiler 2's (0.2-8.3),
    both with step n. They are one step, measured from the first marker, as the step
    rows were before markers were checked (main 03adca3: step_ms 8.0): step 8, input
    0.5, compute 4, other 3.5, one replica row per step."""
    space = three_step_trace(builder, 18.0)
    for step, start in ((1, 0.0), (2, 10.0), (3, 20.0)):
        marker(space, "python", step, start + 0.2, start + 8.3)
    result = analyze_trace(space.write(tmp_path))
    assert result.unmeasured is None
    assert result.steps["step"].tolist() == [1, 2, 3]
    assert len(result.replicas) == 3
    for column, value in MEASURED.items():
        assert result.steps[column].tolist() == pytest.approx([value] * 3), column


def test_two_profilers_markers_overlapping_another_step_are_still_untrue(builder, tmp_path):
    """The same, with step 2's two markers reaching 25 ms, into step 3's: steps 2 and 3
    are left out (different step numbers overlap), step 1 is measured."""
    space = three_step_trace(builder, 25.0)
    for step, start in ((1, 0.0), (2, 10.0), (3, 20.0)):
        marker(space, "python", step, start + 0.2, 25.3 if step == 2 else start + 8.3)
    result = analyze_trace(space.write(tmp_path))
    steps = result.steps.set_index("step")
    assert steps.loc[1, list(MEASURED)].tolist() == pytest.approx(list(MEASURED.values()))
    assert steps.loc[[2, 3], TIMES].isna().all().all()
    assert result.unmeasured.startswith("steps 2-3 not measured: the marker overlaps")


def test_threads_named_alike_are_told_apart(builder, tmp_path):
    """Two fits in two threads of one process: both lines are named "python" (ids 1
    and 2). Thread 1 marks steps 1, 3, 5 at 0, 20, 40 ms, thread 2 steps 2, 4, 6 at
    10, 30, 50, each 15 ms: they overlap across the threads, never on one. Every step
    is measured, 15 ms."""
    space = builder()
    for step in range(1, 7):
        start = 10.0 * (step - 1)
        marker(space, "python" if step % 2 else "python 2", step, start, start + 15.0)
    name_lines(space, "python 2", "python")
    result = analyze_trace(space.write(tmp_path))
    assert result.unmeasured is None
    assert result.steps["step_ms"].tolist() == pytest.approx([15.0] * 6)


def test_a_capture_length_in_another_unit_blanks_nothing(builder, tmp_path):
    """A ``Task Environment`` 1000x too short (40 us for a 40 ms capture: another unit
    or clock): every marker would end after it, but so would the other host events,
    which the profiler kept only if they ended before it stopped. The rule is not
    applied: every step is measured, and ``unmeasured`` says the check was skipped."""
    result = analyze_trace(three_step_trace(builder, 18.0, capture_ms=0.04).write(tmp_path))
    assert result.steps["step_ms"].tolist() == pytest.approx([8.0] * 3)
    assert result.steps["compute_ms"].tolist() == pytest.approx([4.0] * 3)
    assert result.unmeasured.startswith("the capture's length (4e-05 s, Task Environment) was")
    assert "other host events end 0.02496 s after it" in result.unmeasured


def test_lines_timed_from_the_session_start_as_tf_writes_them(builder, tmp_path):
    """Real TF 2.21 captures time host lines from the session start (``timestamp_ns``
    like 17213) while ``profile_start_time`` is a Unix time: the capture rule uses only
    the length, so the 1000 s marker is still caught and the true steps measured."""
    for middle_end, untrue in ((10.0 + 1e15 / 1e9, [2]), (18.0, [])):
        space = three_step_trace(builder, middle_end)
        for line in space.host().plane.lines:
            line.timestamp_ns = 17213
        result = analyze_trace(space.write(tmp_path / str(middle_end)))
        steps = result.steps.set_index("step")
        assert steps.index[steps["step_ms"].isna()].tolist() == untrue
        for step in {1, 2, 3} - set(untrue):
            assert steps.loc[step, list(MEASURED)].tolist() == pytest.approx(
                list(MEASURED.values())
            )
    assert result.unmeasured is None


def test_unmeasured_groups_the_steps_by_reason(builder, tmp_path):
    """Steps 1-3 and 7-8 overlap one another, step 9 outlasts the 100 ms capture (its
    marker 1000 s long); 4-6 are sound. One clause per rule, steps as ranges."""
    space = builder()
    spans = {1: (0, 15), 2: (10, 25), 3: (20, 28), 4: (30, 38), 5: (40, 48), 6: (50, 58)}
    spans |= {7: (60, 75), 8: (70, 78), 9: (80, 80 + 1e15 / 1e9)}
    for step, (start, end) in spans.items():
        marker(space, "python", step, start, end)
        space.host().event("tf_Compute/1", "sequential/dense/MatMul:MatMul", start + 1, start + 5)
    add_capture_length(space, 100.0)
    result = analyze_trace(space.write(tmp_path))
    assert result.unmeasured == (
        "steps 1-3, 7-8 not measured: the marker overlaps another step's on its thread, "
        "where markers follow one another; step 9 not measured: the marker ends after the "
        "capture stopped (the capture lasted 0.1 s), so its duration is not the step's"
    )
    assert result.steps.set_index("step")["step_ms"].dropna().tolist() == [8.0] * 3


def test_a_step_number_marked_twice_is_empty_if_one_marker_is_untrue(builder, tmp_path):
    """Two fits in one capture (thread names differ: "python" and "python 2") both mark
    steps 1 and 2; the second fit's step 2 marker lasts 1000 s in a 60 ms capture. Step
    2's row is empty with the reason (not the first fit's 8 ms, as ``unmeasured`` names
    step 2); step 1 is measured from its first marker."""
    space = builder()
    for line, step, start in (("python", 1, 0.0), ("python", 2, 10.0), ("python 2", 1, 20.0)):
        marker(space, line, step, start, start + 8.0)
    marker(space, "python 2", 2, 30.0, 30.0 + 1e15 / 1e9)
    space.host().event("tf_Compute/1", "sequential/dense/MatMul:MatMul", 1.0, 5.0)
    add_capture_length(space, 60.0)
    result = analyze_trace(space.write(tmp_path))
    steps = result.steps.set_index("step")
    assert steps.loc[1, "step_ms"] == pytest.approx(8.0)
    assert steps.loc[2, TIMES].isna().all(), steps.loc[2, TIMES]
    assert steps.loc[2, "bandwidth_note"].startswith("not measured: its marker ends 999.97 s")
    assert result.unmeasured.startswith("step 2 not measured: the marker ends after")


def test_one_step_marked_at_one_time_on_two_threads_stays_two_markers():
    from keras_dp_tools.analysis.trace.xspace import STEP_EVENT_NAME, TraceEvent, step_markers

    def marker(line_id, end_ps):
        stats = {"step_num": 4, "kdp": 1}
        return TraceEvent("/host:CPU", "python", STEP_EVENT_NAME, 1000, end_ps, stats, line_id)

    kept = step_markers([marker(1, 9000), marker(2, 7000)])

    assert sorted((m.thread[1], m.end_ps) for m in kept) == [(1, 9000), (2, 7000)]


def test_xprofs_steps_pair_with_ours_only_where_the_pairing_is_known():
    import pandas as pd

    ours = pd.Series([1, 2, 3])

    def paired(xprof_numbers):
        xprof = pd.DataFrame({"step": xprof_numbers, "xprof_step_ms": range(len(xprof_numbers))})
        return xprof_steps.align_steps(xprof, ours)["step"].tolist()

    assert paired([0, 1, 2]) == [1, 2, 3]  # GPU: XProf counts from 0, same steps in order
    assert paired([2, 3]) == [2, 3]  # XProf's numbers are ours: by number
    # Six groups for three steps (two profilers' crossing markers): numbers 1-3 of
    # XProf's are not our steps 1-3, and there is no position to pair by.
    assert paired([0, 1, 2, 3, 4, 5]) == []
