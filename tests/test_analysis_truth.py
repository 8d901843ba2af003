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


def test_keras_dp_analyze_hands_freed_memory_back(builder, tmp_path, trims):
    """``keras-dp analyze`` has its process to itself: its analysis trims the heap."""
    from keras_dp_tools.cli import main

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
