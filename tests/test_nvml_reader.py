"""NvmlReader's conversions on pynvml's own ctypes structures (tests/helpers/nvml_fake.py),
expected values from the units NVML documents."""

import sys

import pynvml
import pytest

from keras_dp_tools.capture.monitor.nvml_reader import NvmlReader
from tests.helpers.nvml_fake import GIB, FakeGpu, fake_pynvml

MIB_PER_S_IN_GBPS = 2**20 / 1e9  # GPM reports NVLink MiB/s


@pytest.fixture
def nvml(monkeypatch):
    def install(*gpus):
        module = fake_pynvml(list(gpus))
        monkeypatch.setitem(sys.modules, "pynvml", module)
        return module

    return install


def test_polled_readings_are_converted_to_documented_units(nvml):
    """Memory in bytes -> GiB, power in mW -> W, percentages and clocks as numbers."""
    nvml(FakeGpu(gpm=False, nvlink_kib=[(0, 0)]))
    reader = NvmlReader(high_rate=False)
    (device,) = reader.open()
    assert (device.name, device.pci_bus_id, device.gpm) == (
        "NVIDIA H100 80GB HBM3",
        "00000000:1B:00.0",
        False,
    )
    (reading,) = reader.read()
    assert reading["util_gpu"] == 87.0 and reading["util_memory"] == 41.0
    assert reading["mem_used_gb"] == 20.0 and reading["mem_total_gb"] == 80.0
    assert reading["power_w"] == 312.5
    assert reading["sm_clock_mhz"] == 1980.0 and reading["temperature_c"] == 63.0
    reader.close()


def test_gpm_metrics_pair_consecutive_samples_and_convert_nvlink(nvml):
    """GPM needs two samples: the first read has no GPM values, the second compares
    samples 0 and 1, the third 1 and 2, freeing each old sample once it is used."""
    gpu = FakeGpu(
        gpm_values={
            pynvml.NVML_GPM_METRIC_SM_UTIL: 42.5,
            pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: 30.0,
            pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 12.0,
            pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: 100_000.0,
            pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: 50_000.0,
        },
        gpm_unsupported_metrics={pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL},
    )
    module = nvml(gpu)
    reader = NvmlReader(high_rate=False)
    reader.open()

    first = reader.read()[0]
    assert first.get("sm_activity") is None
    second = reader.read()[0]
    assert second["sm_activity"] == 42.5 and second["sm_occupancy"] == 30.0
    assert second["dram_bw_util"] == 12.0
    assert "tensor_activity" not in second  # the driver said NOT_SUPPORTED for it
    assert second["nvlink_rx_gbps"] == pytest.approx(100_000 * MIB_PER_S_IN_GBPS)  # 104.9
    assert second["nvlink_tx_gbps"] == pytest.approx(50_000 * MIB_PER_S_IN_GBPS)
    reader.read()
    assert module.gpm_pairs == [(0, 1), (1, 2)]
    assert module.gpm_freed == [0, 1]
    reader.close()
    assert module.gpm_freed == [0, 1, 2]


def test_nvlink_counters_give_rates_between_reads(nvml):
    """Without GPM: cumulative KiB counters; 2,000,000 KiB received between two reads
    t seconds apart is 2e6 * 1024 / t bytes per second."""
    nvml(FakeGpu(gpm=False, nvlink_kib=[(1_000, 5_000), (2_001_000, 1_005_000)]))
    reader = NvmlReader(high_rate=False)
    reader.open()
    first = reader.read()[0]
    assert first.get("nvlink_rx_gbps") is None  # a rate needs two counter values
    second = reader.read()[0]
    seconds = second["time"] - first["time"]
    assert second["nvlink_rx_gbps"] == pytest.approx(2_000_000 * 1024 / seconds / 1e9)
    assert second["nvlink_tx_gbps"] == pytest.approx(1_000_000 * 1024 / seconds / 1e9)
    reader.close()


def test_buffered_samples_are_read_once_in_driver_time(nvml, monkeypatch):
    """nvmlDeviceGetSamples returns the buffer since a timestamp (µs); samples older
    than the first read are not ours, each later one comes back exactly once."""
    import keras_dp_tools.capture.monitor.nvml_reader as nvml_reader

    start_s = 1_800_000_000.0
    monkeypatch.setattr(nvml_reader.time, "time", lambda: start_s)
    gpu = FakeGpu(gpm=False, nvlink_kib=[(0, 0)] * 3)
    gpu.samples = [(int(start_s * 1e6) - 500_000, 99), (int(start_s * 1e6) + 166_667, 50)]
    nvml(gpu)
    reader = NvmlReader()
    reader.open()

    buffered = [r for r in reader.read() if r["sampling"] == "buffer"]
    assert [(r["time"], r["util_gpu"]) for r in buffered] == [(start_s + 0.166667, 50.0)]
    gpu.samples.append((int(start_s * 1e6) + 333_333, 75))
    buffered = [r for r in reader.read() if r["sampling"] == "buffer"]
    assert [(r["time"], r["util_gpu"]) for r in buffered] == [(start_s + 0.333333, 75.0)]
    assert [r for r in reader.read() if r["sampling"] == "buffer"] == []
    reader.close()


def test_unsupported_fields_read_as_none_and_are_not_asked_again(nvml):
    gpu = FakeGpu(gpm=False, nvlink_kib=[(0, 0)] * 2, unsupported={"power", "temperature"})
    module = nvml(gpu)
    reader = NvmlReader(high_rate=False)
    reader.open()
    readings = reader.read() + reader.read()
    assert [r["power_w"] for r in readings] == [None, None]
    assert [r["temperature_c"] for r in readings] == [None, None]
    assert [r["util_gpu"] for r in readings] == [87.0, 87.0]
    assert module.calls.count("power") == 1 and module.calls.count("utilization") == 2
    reader.close()


def test_gpus_are_found_by_pci_bus_id(nvml):
    nvml(FakeGpu(bus_id="00000000:1B:00.0"), FakeGpu(bus_id="00000000:2C:00.0", uuid="GPU-b"))
    reader = NvmlReader(pci_bus_ids=["00000000:2C:00.0"], high_rate=False)
    (device,) = reader.open()
    assert (device.gpu, device.nvml_index, device.uuid) == (0, 1, "GPU-b")
    assert reader.read()[0]["mem_total_gb"] == 80 * GIB / GIB
    reader.close()
