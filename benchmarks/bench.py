"""keras_dp_tools benchmarks: ``make bench`` writes ``benchmarks/RESULTS.md``.

Every comparison runs its variants interleaved (A, B, A, B, ...) in one process, so
drift of a shared machine hits all of them alike; the table gives the median of the
per-round ratios with their min and max. Absolute times are printed for orientation
only. ``--smoke`` runs a tiny version in seconds (the test suite does, to keep this
script working); its numbers mean nothing.

Run: ``python benchmarks/bench.py [--smoke] [--output PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

MS = 1_000_000_000  # picoseconds per millisecond


# -- machine -----------------------------------------------------------------------


def machine() -> dict:
    cpu = "unknown"
    with open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    import tensorflow as tf

    return {
        "cores": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": round(pages / 2**30, 1),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "load_average": os.getloadavg()[0],
    }


def ratios(rounds: list[dict], variant: str, baseline: str) -> dict:
    values = [r[variant] / r[baseline] for r in rounds]
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "rounds": len(values),
        "baseline_s": statistics.median(r[baseline] for r in rounds),
        "variant_s": statistics.median(r[variant] for r in rounds),
    }


def interleave(variants: dict, rounds: int) -> list[dict]:
    """Each round times every variant once, in rotating order."""
    results = []
    names = list(variants)
    for index in range(rounds):
        order = names[index % len(names) :] + names[: index % len(names)]
        timed = {}
        for name in order:
            start = time.perf_counter()
            variants[name]()
            timed[name] = time.perf_counter() - start
        results.append(timed)
    return results


# -- synthetic traces ----------------------------------------------------------------


def synthetic_trace(path: Path, events: int, replicas: int = 4) -> Path:
    """A CPU-device trace shaped like a real one: per step and replica, compute ops on
    the replica's thread, one all-reduce (peers share an ``instance_key``), an input
    wait; a ``train`` marker per step on the python line. ~``events`` events."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    ops_per_replica = 46  # + 1 collective + 1 input wait = 48 events per replica-step
    steps = max(1, round(events / (replicas * (ops_per_replica + 2))))
    space = xplane_pb2.XSpace()
    plane = space.planes.add(id=1, name="/host:CPU")
    stat_names = ["step_num", "_r", "kdp", "instance_key", "group_key"]
    for stat_id, name in enumerate(stat_names, 1):
        plane.stat_metadata[stat_id].id = stat_id
        plane.stat_metadata[stat_id].name = name
    names = ["train", "IteratorGetNextOp::DoCompute"]
    for replica in range(replicas):
        scope = f"replica_{replica}/" if replica else ""
        names += [f"{scope}model/dense_{op}/MatMul:_MklMatMul" for op in range(ops_per_replica)]
        suffix = f"_{replica}" if replica else ""
        names.append(f"StatefulPartitionedCall/adam/CollectiveReduceV2{suffix}:CollectiveReduceV2")
    for event_id, name in enumerate(names, 1):
        plane.event_metadata[event_id].id = event_id
        plane.event_metadata[event_id].name = name
    line_start_ns = 1_700_000_000_000_000_000
    python = plane.lines.add(id=1, name="python", timestamp_ns=line_start_ns)
    threads = [
        plane.lines.add(id=2 + r, name=f"tf_Compute/{r}", timestamp_ns=line_start_ns)
        for r in range(replicas)
    ]
    step_ps = 10 * MS
    per_op = 8 * MS // ops_per_replica
    for step in range(steps):
        base = step * step_ps
        marker = python.events.add(metadata_id=1, offset_ps=base, duration_ps=step_ps - MS // 10)
        for stat_id, value in ((1, step), (2, 1), (3, 1)):
            marker.stats.add(metadata_id=stat_id, int64_value=value)
        for replica, line in enumerate(threads):
            first = 3 + replica * (ops_per_replica + 1)
            line.events.add(metadata_id=2, offset_ps=base + MS // 20, duration_ps=MS // 10)
            for op in range(ops_per_replica):
                start = base + MS // 5 + op * per_op
                line.events.add(metadata_id=first + op, offset_ps=start, duration_ps=per_op - 1000)
            collective = line.events.add(
                metadata_id=first + ops_per_replica,
                offset_ps=base + 8 * MS + replica * MS // 10,
                duration_ps=MS - replica * MS // 10,
            )
            collective.stats.add(metadata_id=4, int64_value=step + 100)
            collective.stats.add(metadata_id=5, int64_value=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(space.SerializeToString())
    return path


_MEASURE_CHILD = """
import json, sys, time, tracemalloc
sys.path.insert(0, sys.argv[2])
from keras_dp_tools.analysis import analyze_trace
from keras_dp_tools.analysis.xspace import _xplane_pb2
_xplane_pb2()

def status_kib(field):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])

traced = sys.argv[3] == "tracemalloc"
if traced:
    tracemalloc.start()
else:  # imports done: reset the peak RSS (VmHWM) to the current RSS
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")
before = status_kib("VmRSS")
start = time.perf_counter()
result = analyze_trace(sys.argv[1], allreduce_bytes=1 << 20)
seconds = time.perf_counter() - start
measured = {"seconds": seconds, "rows": len(result.replicas)}
if traced:
    measured["python_peak_kib"] = tracemalloc.get_traced_memory()[1] / 1024
else:
    measured["growth_kib"] = status_kib("VmHWM") - before
print(json.dumps(measured))
"""


def measure_in_child(trace: Path, mode: str = "rss") -> dict:
    """Analysis time and memory of one trace in a fresh process that has imported
    everything first: with ``mode="rss"`` the growth of the peak RSS during the
    analysis (Linux: the peak is reset after the imports); with ``"tracemalloc"``
    the peak of Python's own allocations (numpy included; not the protobuf arena)."""
    output = subprocess.run(
        [sys.executable, "-c", _MEASURE_CHILD, str(trace), str(ROOT), mode],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(output.strip().splitlines()[-1])


def bench_synthetic(sizes: list[int], folder: Path) -> list[dict]:
    rows = []
    for events in sizes:
        trace = synthetic_trace(folder / f"synthetic_{events}" / "host.xplane.pb", events)
        measured = measure_in_child(trace)
        traced = measure_in_child(trace, "tracemalloc")
        size = trace.stat().st_size
        rows.append(
            {
                "events": events,
                "file_mb": size / 1e6,
                "seconds": measured["seconds"],
                "us_per_event": measured["seconds"] / events * 1e6,
                "memory_growth_mb": measured["growth_kib"] * 1024 / 1e6,
                "memory_over_file": measured["growth_kib"] * 1024 / size,
                "python_peak_mb": traced["python_peak_kib"] * 1024 / 1e6,
            }
        )
        print(f"synthetic {events}: {rows[-1]}", flush=True)
    return rows


# -- analysis vs XProf -------------------------------------------------------------


def bench_xprof(trace: Path, rounds: int) -> dict:
    from xprof.convert import raw_to_tool_data

    from keras_dp_tools.analysis import analyze_trace

    def xprof():
        raw_to_tool_data.xspace_to_tool_data(
            [str(trace)], "input_pipeline_analyzer", {"use_saved_result": False}
        )

    analyze_trace(trace)  # warm imports for both
    xprof()
    timed = interleave({"analysis": lambda: analyze_trace(trace), "xprof": xprof}, rounds)
    return ratios(timed, "analysis", "xprof")


# -- Report.load ---------------------------------------------------------------------


def write_step_records(path: Path, rows: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    header = {"type": "header", "schema": 1, "run": "bench", "worker": 0, "time": 0.0}
    with open(path, "w") as out:
        out.write(json.dumps(header) + "\n")
        for step in range(rows):
            record = {
                "type": "step",
                "run": "bench",
                "worker": 0,
                "time": 1.7e9 + step * 0.02,
                "epoch": step // 1000,
                "step": step,
                "steps": 1,
                "step_ms": 20.0 + (step % 7),
                "examples_per_s": 3200.0,
                "warmup": step == 0,
            }
            out.write(json.dumps(record) + "\n")
    return path


def bench_load(sizes: list[int], folder: Path, rounds: int) -> list[dict]:
    import keras_dp_tools as kdt

    rows = []
    for count in sizes:
        log_dir = folder / f"records_{count}"
        write_step_records(log_dir / "keras_dp" / "worker-0.jsonl", count)
        times, workers_times = [], []
        for _ in range(rounds):
            start = time.perf_counter()
            report = kdt.Report.load(log_dir)
            times.append(time.perf_counter() - start)
            assert len(report.steps) == count, len(report.steps)
            start = time.perf_counter()
            assert len(report.workers) == 1  # computed on first access (summary, text, advice)
            workers_times.append(time.perf_counter() - start)
        rows.append(
            {
                "rows": count,
                "seconds": statistics.median(times),
                "min": min(times),
                "max": max(times),
                "workers_seconds": statistics.median(workers_times),
            }
        )
        print(f"Report.load {count}: {rows[-1]}", flush=True)
    return rows


# -- training overhead -----------------------------------------------------------------


class BatchClock:
    """Times of each batch end (for the disturbance around a window)."""

    def __init__(self, keras):
        times = self.times = []

        class Clock(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                times.append(time.perf_counter())

        self.callback = Clock()


def make_model(keras, strategy, width: int):
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((256,)),
                keras.layers.Dense(width, activation="relu"),
                keras.layers.Dense(width, activation="relu"),
                keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer="adam", loss="mse")
    return model


def bench_training(keras, strategy, folder: Path, models: dict, steps: int, rounds: int):
    """Per model: fit wall time (the amortised cost, window and analysis included) and
    median step time (robust to a busy neighbour) of each variant over bare ``fit``."""
    import keras_dp_tools as kdt

    results = {}
    for label, (width, batch) in models.items():
        model = make_model(keras, strategy, width)
        x = np.random.default_rng(0).normal(size=(batch * steps, 256)).astype("float32")
        y = x[:, :1]
        model.fit(x, y, batch_size=batch, epochs=1, verbose=0)  # trace and warm up
        counter = iter(range(10**6))
        medians: dict[str, list[float]] = {}

        def fit(name, callbacks, model=model, x=x, y=y, batch=batch, medians=medians):
            clock = BatchClock(keras)
            model.fit(
                x, y, batch_size=batch, epochs=1, verbose=0, callbacks=[*callbacks, clock.callback]
            )
            medians.setdefault(name, []).append(float(np.median(np.diff(clock.times))))

        def run_dir(label=label, counter=counter):
            return folder / f"{label}_{next(counter)}"

        variants = {
            "bare": lambda: fit("bare", []),
            "always_on": lambda: fit("always_on", _always_on(kdt, run_dir())),
            "profiler": lambda: fit(
                "profiler", [kdt.DataParallelProfiler(run_dir(), tensorboard=False)]
            ),
        }
        timed = interleave(variants, rounds)
        per_step = [{name: values[i] for name, values in medians.items()} for i in range(rounds)]
        results[label] = {
            "step_ms": statistics.median(medians["bare"]) * 1e3,
            "always_on": ratios(timed, "always_on", "bare"),
            "profiler": ratios(timed, "profiler", "bare"),
            "always_on_step": ratios(per_step, "always_on", "bare"),
            "profiler_step": ratios(per_step, "profiler", "bare"),
        }
        print(f"training {label}: {results[label]}", flush=True)
    return results


def _always_on(kdt, log_dir):
    return [kdt.StepTimer(log_dir, tensorboard=False), kdt.GpuMonitor(log_dir, tensorboard=False)]


def bench_disturbance(keras, strategy, folder: Path, steps: int, rounds: int, after: int = 10):
    """Median step time of the ``after`` steps after a window over the median of the
    steps before it, with the analysis in a thread of the training process (the old
    way) and in a child process (now)."""
    import keras_dp_tools as kdt

    module = sys.modules[kdt.DataParallelProfiler.__module__]
    in_child = module.analyze_in_child

    def in_thread(trace, **arguments):  # the old way: analysis in this process
        from keras_dp_tools.analysis import analyze_trace

        return analyze_trace(trace, **arguments)

    model = make_model(keras, strategy, 512)
    batch = 256
    x = np.random.default_rng(0).normal(size=(batch * steps, 256)).astype("float32")
    model.fit(x, x[:, :1], batch_size=batch, epochs=1, verbose=0)
    start_at, window = 10, 5
    measured = {"thread": [], "process": []}
    for index in range(rounds):
        for how, analyze in (("thread", in_thread), ("process", in_child)):
            module.analyze_in_child = analyze
            clock = BatchClock(keras)
            first = int(model.optimizer.iterations.numpy())
            profiler = kdt.DataParallelProfiler(
                folder / f"disturb_{how}_{index}",
                start_step=first + start_at,
                window=window,
                tensorboard=False,
            )
            model.fit(
                x,
                x[:, :1],
                batch_size=batch,
                epochs=1,
                verbose=0,
                callbacks=[profiler, clock.callback],
            )
            durations = np.diff(clock.times)
            steady = np.median(durations[2 : start_at - 1])
            end = start_at + window
            measured[how].append(float(np.median(durations[end : end + after]) / steady))
    module.analyze_in_child = in_child
    summary = {
        how: {"median": statistics.median(v), "min": min(v), "max": max(v)}
        for how, v in measured.items()
    }
    print(f"disturbance: {summary}", flush=True)
    return summary


def capture_window(keras, strategy, folder: Path) -> Path:
    """A real window of a small convolutional model, for the XProf comparison."""
    import keras_dp_tools as kdt
    from keras_dp_tools.analysis import find_traces

    with strategy.scope():
        model = keras.applications.MobileNetV2(
            input_shape=(64, 64, 3), alpha=0.35, weights=None, classes=10
        )
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    x = np.random.default_rng(0).normal(size=(16 * 9, 64, 64, 3)).astype("float32")
    y = np.zeros((len(x),), "int32")
    log_dir = folder / "capture"
    profiler = kdt.DataParallelProfiler(log_dir, start_step=3, window=5, tensorboard=False)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[profiler])
    return find_traces(log_dir)[-1]


# -- report ----------------------------------------------------------------------------


def markdown(results: dict, smoke: bool) -> str:
    m = results["machine"]
    lines = [
        "# keras_dp_tools benchmarks",
        "",
        "Written by `make bench` (`benchmarks/bench.py`)"
        + (" -- SMOKE RUN, numbers meaningless" if smoke else "")
        + ". Ratios are medians over interleaved rounds in one process (min-max in brackets).",
        "",
        f"Machine: {m['cores']} cores, {m['cpu']}, {m['memory_gib']} GiB, Python {m['python']}, "
        f"TensorFlow {m['tensorflow']}; load average at start {m['load_average']:.2f}.",
        "",
        "## Training overhead (fit wall time over bare fit; goal always-on <= 1.01x, "
        "profiler <= 1.03x)",
        "",
        "Per model: `fit` wall time over bare `fit` (amortised: the default profiler's one",
        "window and its analysis fall inside the timed `fit`), and the median step time",
        "over bare (robust to a busy neighbour).",
        "",
        "| model | bare step | always-on: fit | always-on: step | profiler: fit | profiler: step |",
        "|---|---|---|---|---|---|",
    ]

    def fmt(r):
        return f"{r['median']:.3f}x [{r['min']:.3f}-{r['max']:.3f}]"

    for label, r in results["training"].items():
        lines.append(
            f"| {label} | {r['step_ms']:.1f} ms | {fmt(r['always_on'])} | "
            f"{fmt(r['always_on_step'])} | {fmt(r['profiler'])} | {fmt(r['profiler_step'])} |"
        )
    d = results["disturbance"]
    lines += [
        "",
        "## Steps after a window (median of the 10 steps after / median of steady steps)",
        "",
        "| analysis runs in | ratio |",
        "|---|---|",
        f"| a thread of the training process | {fmt(d['thread'])} |",
        f"| a child process | {fmt(d['process'])} |",
        "",
        "## Analysis of a real window vs XProf's `input_pipeline_analyzer` (goal <= 1.0x)",
        "",
        f"Trace: {results['xprof']['trace_mb']:.1f} MB, {results['xprof']['events']} events. "
        f"analyze_trace {results['xprof']['variant_s']:.2f} s, XProf "
        f"{results['xprof']['baseline_s']:.2f} s: ratio {fmt(results['xprof'])}.",
        "",
        "## Synthetic traces (analysis in a fresh process; goal 1M events < 5 s, memory < 3x file)",
        "",
        "Memory: growth of the peak RSS during the analysis (imports done, peak reset), and",
        "the peak of Python allocations (tracemalloc, a second run) for comparison.",
        "",
        "| events | file | time | per event | peak RSS growth | growth / file | Python peak |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results["synthetic"]:
        lines.append(
            f"| {r['events']:,} | {r['file_mb']:.1f} MB | {r['seconds']:.2f} s | "
            f"{r['us_per_event']:.2f} us | {r['memory_growth_mb']:.1f} MB | "
            f"{r['memory_over_file']:.1f}x | {r['python_peak_mb']:.1f} MB |"
        )
    lines += [
        "",
        "## `Report.load` of step records (goal 1M rows < 2 s)",
        "",
        "| rows | time (median) |",
        "|---|---|",
    ]
    for r in results["report_load"]:
        lines.append(f"| {r['rows']:,} | {r['seconds']:.2f} s |")
    notes = results.get("notes")
    if notes:
        lines += ["", "## Notes", "", notes]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny run: checks the script")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "RESULTS.md")
    parser.add_argument(
        "--notes",
        type=Path,
        default=ROOT / "benchmarks" / "NOTES.md",
        help="text appended to the results (what limits a missed goal)",
    )
    args = parser.parse_args(argv)
    smoke = args.smoke
    import keras_dp_tools as kdt

    kdt.configure_devices(4)
    import keras
    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(4)])
    results = {"machine": machine()}
    print(f"machine: {results['machine']}", flush=True)
    with tempfile.TemporaryDirectory(prefix="kdp_bench_") as scratch:
        folder = Path(scratch)
        if smoke:
            models, steps, rounds = {"tiny": (16, 32)}, 24, 1
        else:
            models = {"small": (64, 64), "large": (384, 512)}
            steps, rounds = 30, 4
        results["training"] = bench_training(keras, strategy, folder, models, steps, rounds)
        results["disturbance"] = bench_disturbance(
            keras,
            strategy,
            folder,
            steps=40 if smoke else 60,
            rounds=1 if smoke else 3,
            after=3 if smoke else 10,
        )
        if smoke:
            trace = synthetic_trace(folder / "small" / "host.xplane.pb", 2000)
        else:
            trace = capture_window(keras, strategy, folder)
        from keras_dp_tools.analysis.xspace import load_xspace

        xprof = bench_xprof(trace, 1 if smoke else 5)
        space = load_xspace(trace)
        xprof["events"] = sum(len(line.events) for p in space.planes for line in p.lines)
        xprof["trace_mb"] = trace.stat().st_size / 1e6
        results["xprof"] = xprof
        print(f"analysis vs xprof: {xprof}", flush=True)
        sizes = [2000] if smoke else [10_000, 100_000, 1_000_000]
        results["synthetic"] = bench_synthetic(sizes, folder)
        load_sizes = [1000] if smoke else [10_000, 100_000, 1_000_000]
        results["report_load"] = bench_load(load_sizes, folder, 1 if smoke else 3)
    if args.notes.exists() and not smoke:
        results["notes"] = args.notes.read_text().strip()
    text = markdown(results, smoke)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
