"""GpuMonitor during real training on CPU devices: the no-GPU path, and a recorded stream
of GPU readings replayed through the reader interface."""

import gc
import json
import threading
import time
import warnings
from pathlib import Path

import pytest

import keras_dp_tools as kdt
from keras_dp_tools import NoGpuWarning
from keras_dp_tools.capture.monitor.nvml_reader import NvmlReader
from keras_dp_tools.capture.monitor.replay import ReplayReader
from keras_dp_tools.capture.monitor.sampler import THREAD_NAME
from tests.helpers.nvml_fake import nvml_works
from tests.helpers.training import dense_model, fit, iterations


def sampler_threads():
    return [thread for thread in threading.enumerate() if thread.name == THREAD_NAME]


def constant_stream(seconds=60.0, every=0.02):
    """GPU 0 at 40% and GPU 1 at 80%, read every 20 ms."""
    count = int(seconds / every)
    return [
        {"offset_s": k * every, "gpu": gpu, "util_gpu": util, "mem_used_gb": 3.0, "power_w": 150.0}
        for k in range(count)
        for gpu, util in ((0, 40.0), (1, 80.0))
    ]


def fit_start_gap(log_dir) -> str:
    """How long the fit took from its header to its first step, and how busy it was."""
    records = [json.loads(line) for line in next(Path(log_dir).rglob("*.jsonl")).open()]
    header = next(r for r in records if r["type"] == "header")
    first = next(r for r in records if r["type"] == "step")
    cpu = next((r for r in records if r["type"] == "cpu_sample"), {})
    busy = {key: round(cpu.get(f"{key}_cpu_percent") or -1, 1) for key in ("process", "system")}
    return (
        f"the first step began {first['time'] - header['time']:.1f} s after the header; "
        f"CPU until the first reading: process {busy['process']}%, machine {busy['system']}%"
    )


def test_cpu_only_run_records_why_and_cpu_usage(tmp_path, keras, strategy4):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # counted as raised, not as Python shows them
        fit(dense_model(keras, strategy4), [kdt.GpuMonitor(tmp_path, interval=0.01)], epochs=2)

    report = kdt.Report.load(tmp_path)
    run = report.runs.iloc[0]
    assert not run["gpu_available"]
    assert "uses no GPU" in run["gpu_reason"]
    assert report.gpu.empty and report.steps["gpu_util_mean"].isna().all()
    assert len(report.cpu) >= 2 and (report.cpu["process_cpu_percent"] >= 0).all()
    # Once per fit, as a warning (Python shows it by default; INFO logs it does not).
    shown = [w for w in caught if "no GPU data" in str(w.message)]
    assert len(shown) == 1 and issubclass(shown[0].category, NoGpuWarning)
    assert not sampler_threads()


@pytest.mark.skipif(nvml_works(), reason="NVML works on this machine")
def test_missing_nvml_is_recorded_and_training_is_unaffected(tmp_path, keras, strategy4):
    model = dense_model(keras, strategy4)
    fit(model, [kdt.GpuMonitor(tmp_path, source=NvmlReader())])

    assert iterations(model) == 7
    reason = kdt.Report.load(tmp_path).runs.iloc[0]["gpu_reason"]
    assert "NVML could not start" in reason
    assert not sampler_threads()


def test_replayed_readings_align_to_steps(tmp_path, keras, strategy4):
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    monitor = kdt.GpuMonitor(tmp_path, interval=0.02, source=ReplayReader(constant_stream()))
    callbacks = [kdt.StepTimer(tmp_path), monitor]
    model = dense_model(keras, strategy4)
    # Earlier tests' tf.data iterators, freed now rather than inside the fit: TensorFlow
    # deletes one by waiting for its background threads, and in the full suite that
    # blocked the training thread for 8 s and more (py-spy: ~IteratorResource in an
    # EagerTensor's dealloc). Stalls of 25-90 s before a fit's first step, longer than
    # the stream, looked the same. The replay's clock starts in on_train_begin.
    gc.collect()
    fit(model, callbacks, epochs=3)

    report = kdt.Report.load(tmp_path)
    assert report.runs.iloc[0]["gpu_available"]
    assert set(report.gpu["gpu"]) == {0, 1} and (report.gpu["sampling"] == "poll").all()
    covered = report.steps.dropna(subset=["gpu_util_mean"])
    # All but the steps before the first readings arrived. The stream lasts 60 s: a fit
    # that stalls longer before its first step has none (CI saw that; say so).
    assert len(covered) >= 15, f"{len(covered)} steps covered; {fit_start_gap(tmp_path)}"
    assert covered["gpu_util_mean"].tolist() == pytest.approx([60.0] * len(covered))
    by_epoch = report.gpu_by_epoch()
    assert set(by_epoch["gpu"]) == {0, 1}
    assert by_epoch.groupby("gpu")["gpu_util"].mean().tolist() == pytest.approx([40.0, 80.0])
    assert report.summary()["gpu_util"].iloc[0] == pytest.approx(60.0)
    assert not sampler_threads()

    multiplexer = EventMultiplexer(size_guidance={"tensors": 0})
    multiplexer.AddRunsFromDirectory(str(tmp_path))
    multiplexer.Reload()
    run = multiplexer.GetAccumulator("keras_dp/worker-0")
    tags = set(run.Tags()["tensors"])
    assert {"gpu/0/util", "gpu/1/mem_used_gb", "host/cpu_process_percent"} <= tags
    # Points sit at global steps of this fit (7 a epoch); each epoch end reads CPU usage.
    host_steps = [event.step for event in run.Tensors("host/cpu_process_percent")]
    gpu_steps = [event.step for event in run.Tensors("gpu/0/util")]
    assert {7, 14, 21} <= set(host_steps) and set(host_steps + gpu_steps) <= set(range(22))
    assert host_steps == sorted(host_steps) and gpu_steps == sorted(gpu_steps)


def test_sampler_does_not_outlive_a_crashed_fit(tmp_path, keras, strategy4):
    class Crash(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:
                raise RuntimeError("user code failed")

    source = ReplayReader(constant_stream())
    monitor = kdt.GpuMonitor(tmp_path, interval=0.02, source=source, idle_timeout=0.2)
    with pytest.raises(RuntimeError, match="user code failed"):
        fit(dense_model(keras, strategy4), [monitor, Crash()])

    time.sleep(0.6)
    assert not sampler_threads()


def test_a_failing_reader_warns_once_and_training_goes_on(tmp_path, keras, strategy4):
    class Failing(ReplayReader):
        def read(self):
            raise RuntimeError("GPU fell off the bus")

    model = dense_model(keras, strategy4)
    monitor = kdt.GpuMonitor(tmp_path, interval=0.01, source=Failing(constant_stream(1.0)))
    with pytest.warns(kdt.MeasurementWarning, match="GPU fell off the bus"):
        fit(model, [monitor], epochs=2)

    assert iterations(model) == 14
    run = kdt.Report.load(tmp_path).runs.iloc[0]
    assert not run["gpu_available"] and "GPU fell off the bus" in run["gpu_reason"]
    assert not sampler_threads()


def test_invalid_interval_names_the_value(tmp_path):
    with pytest.raises(ValueError, match="received 0"):
        kdt.GpuMonitor(tmp_path, interval=0)


def test_the_no_gpu_warning_made_an_error_stops_no_reading(tmp_path, keras, strategy4):
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoGpuWarning)  # the user's -W error
        warnings.simplefilter("error", kdt.MeasurementWarning)  # nor may the monitor fail
        fit(dense_model(keras, strategy4), [kdt.GpuMonitor(tmp_path, interval=0.01)], epochs=2)

    report = kdt.Report.load(tmp_path)
    assert "uses no GPU" in report.runs.iloc[0]["gpu_reason"]
    assert len(report.cpu) >= 2  # the CPU readings went on
