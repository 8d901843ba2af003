"""The analysis is linear in events: ten times the events of the benchmark's synthetic
trace take well under twenty times as long (an engine that scanned every span per
step would take about a hundred times). Ratios of interleaved runs, no absolute times.
Its peak memory stays under three times the trace file (the kernel's peak RSS)."""

import importlib.util
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from keras_dp_tools.analysis import analyze_trace
from keras_dp_tools.analysis.breakdown import memory

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks" / "bench.py"


def _bench():
    spec = importlib.util.spec_from_file_location("kdp_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_ten_times_the_events_take_less_than_twenty_times_as_long(tmp_path, tf):
    bench = _bench()
    small = bench.synthetic_trace(tmp_path / "small.xplane.pb", 15_000)
    large = bench.synthetic_trace(tmp_path / "large.xplane.pb", 150_000)
    analyze_trace(small)  # first call: lazy imports and caches
    ratios = []
    for _ in range(3):
        timed = {}
        for name, trace in (("small", small), ("large", large)):
            start = time.perf_counter()
            analyze_trace(trace)
            timed[name] = time.perf_counter() - start
        ratios.append(timed["large"] / timed["small"])
    assert statistics.median(ratios) < 20, ratios


# In a fresh process: a first analysis of a small trace pays the one-off costs (lazy
# imports, pandas' and pyarrow's first allocations, ~10 MB); then the peak RSS is
# reset to the current RSS (Linux: /proc/self/clear_refs) and the large trace analysed.
_PEAK_GROWTH = """
import json, sys
sys.path.insert(0, sys.argv[3])
from keras_dp_tools.analysis import analyze_trace
analyze_trace(sys.argv[2])

def kib(field):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])

with open("/proc/self/clear_refs", "w") as clear:
    clear.write("5")
before = kib("VmRSS")
analyze_trace(sys.argv[1], release_memory=True)  # a process of its own, as the child
print(json.dumps(kib("VmHWM") - before))
"""


@pytest.mark.slow
@pytest.mark.skipif(
    not Path("/proc/self/clear_refs").exists(), reason="needs Linux's resettable peak RSS"
)
@pytest.mark.skipif(memory.malloc_trim() is None, reason="needs glibc's malloc_trim")
def test_peak_memory_of_an_analysis_is_under_three_times_its_file(tmp_path, tf):
    """The goal of issue 12 (< 3x the file) at 300k events, in a process of its own
    (``release_memory``, as the profiler's child). Measured: 2.2-2.6x (11-14 MB for a
    5.3 MB file; 2.3-2.4x at 1M events); untrimmed 3.6x (3.2x at 1M). The engine before
    held a span-sized step index and the heap its line pieces left: 5.8-6.5x here, 4.6x
    at 1M."""
    bench = _bench()
    small = bench.synthetic_trace(tmp_path / "small.xplane.pb", 10_000)
    large = bench.synthetic_trace(tmp_path / "large.xplane.pb", 300_000)
    output = subprocess.run(
        [sys.executable, "-c", _PEAK_GROWTH, str(large), str(small), str(ROOT)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    growth = json.loads(output.strip().splitlines()[-1]) * 1024
    assert growth < 3 * large.stat().st_size, (growth, large.stat().st_size)


class _CountedTrim:
    """Stands in for glibc's ``malloc_trim``: counts the calls, trims nothing."""

    def __init__(self):
        self.calls = 0

    def __call__(self, pad: int) -> int:
        self.calls += 1
        return 0


def test_the_heap_is_trimmed_only_where_the_analysis_has_its_process(tmp_path, monkeypatch):
    """Trimming takes glibc's heap locks (TF's threads stall) and pages fault back in:
    the profiler's analysis in a thread of the training process (traces under
    ``CHILD_PROCESS_MIN_BYTES``) never trims; a caller with a process of its own (the
    child analysis, the CLI) asks for it, and then the analysis trims between stages."""
    from keras_dp_tools.analysis import runner
    from keras_dp_tools.records.facts import RunFacts

    trace = _bench().synthetic_trace(tmp_path / "host.xplane.pb", 2_000)
    assert trace.stat().st_size < runner.CHILD_PROCESS_MIN_BYTES
    trim = _CountedTrim()
    monkeypatch.setattr(memory, "malloc_trim", lambda: trim)
    windows = runner.WindowRunner()  # as the profiler's, which analyses in its thread
    try:
        breakdown = windows.submit(trace, RunFacts()).result()
    finally:
        windows.shutdown()
    assert len(breakdown.steps) > 0
    assert trim.calls == 0  # the training process's heap is left alone
    analyze_trace(trace)
    assert trim.calls == 0  # the default: callers may be training
    analyze_trace(trace, release_memory=True)
    assert trim.calls > 0
