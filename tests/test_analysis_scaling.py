"""The analysis is linear in events: ten times the events of the benchmark's synthetic
trace take well under twenty times as long (an engine that scanned every span per
step would take about a hundred times). Ratios of interleaved runs, no absolute times."""

import importlib.util
import statistics
import time
from pathlib import Path

import pytest

from keras_dp_tools.analysis import analyze_trace

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench.py"


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
