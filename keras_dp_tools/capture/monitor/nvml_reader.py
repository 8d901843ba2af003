"""NvmlReader: GPU readings through NVML (``pynvml``, from the ``nvidia-ml-py`` package).

What NVML's numbers mean (docs/gpu_monitor.md has more):

* ``util_gpu``: percent of the last sample period (1/6 s to 1 s by product) during
  which *at least one kernel* ran. One tiny kernel running all the time reads 100%; it
  says nothing about how many SMs are busy.
* ``sm_activity`` / ``sm_occupancy`` (GPM, Hopper and newer): share of SMs busy, and of
  warps resident against the maximum, over the time between two readings. When
  ``sm_activity`` is much lower than ``util_gpu`` the GPU is "busy" with small kernels.

Imports only the standard library and ``pynvml``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass, field

from keras_dp_tools.records import columns as schema

logger = logging.getLogger("keras_dp_tools")

GIB = 1024**3
# Fields of one polled reading, besides time and gpu (keras_dp_tools.records.columns). None: not
# supported / not read.
READING_FIELDS = schema.READING_FIELDS


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used here; the message says why (no driver, no GPU, ...)."""


@dataclass
class GpuDevice:
    """A monitored GPU: ``gpu`` is its position in the list asked for (the replica's
    TF ordinal), ``nvml_index`` NVML's index of it (all GPUs, unaffected by
    ``CUDA_VISIBLE_DEVICES``)."""

    gpu: int
    nvml_index: int
    name: str
    uuid: str
    pci_bus_id: str
    gpm: bool = False
    handle: object = field(default=None, repr=False)


def visible_nvml_indices(count: int, environ=os.environ) -> list[str | int]:
    """NVML identities of the first ``count`` CUDA-visible GPUs.

    Args:
        count: how many GPUs the strategy uses.
        environ: the process's environment.

    Returns:
        ``CUDA_VISIBLE_DEVICES`` entries (indices as ints, UUIDs as text) if set, else
        indices 0..count-1.

    Raises:
        NvmlUnavailable: ``CUDA_VISIBLE_DEVICES`` lists fewer GPUs than ``count``.

    Example:

    >>> from keras_dp_tools.capture.monitor.nvml_reader import visible_nvml_indices
    >>> visible_nvml_indices(2, {"CUDA_VISIBLE_DEVICES": "3,GPU-5f2c"}), visible_nvml_indices(2, {})
    ([3, 'GPU-5f2c'], [0, 1])
    """
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(range(count))
    entries = [entry.strip() for entry in visible.split(",") if entry.strip()]
    if len(entries) < count:
        raise NvmlUnavailable(
            f"CUDA_VISIBLE_DEVICES={visible!r} lists {len(entries)} GPU(s) but {count} are in use."
        )
    return [int(entry) if entry.isdigit() else entry for entry in entries[:count]]


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlReader:
    """Reads utilization, memory, power, clocks and temperature of some GPUs via NVML.

    Example:

    ```python
    from keras_dp_tools.capture.monitor.nvml_reader import NvmlReader, NvmlUnavailable

    reader = NvmlReader()
    try:
        devices = reader.open()  # all GPUs
    except NvmlUnavailable as reason:
        print("no GPU data:", reason)
    else:
        print(reader.read())  # one dict per GPU
        reader.close()
    ```

    Args:
        pci_bus_ids: the GPUs to read, by PCI bus id (what TensorFlow reports); takes
            precedence over ``identities``.
        identities: NVML indices or UUIDs (``visible_nvml_indices`` maps
            ``CUDA_VISIBLE_DEVICES``). Default: every GPU.
        high_rate: also drain the driver's timestamped utilization buffer
            (``nvmlDeviceGetSamples``) on each read.
    """

    def __init__(self, pci_bus_ids=None, identities=None, high_rate: bool = True):
        self.pci_bus_ids = list(pci_bus_ids) if pci_bus_ids else None
        self.identities = list(identities) if identities is not None else None
        self.high_rate = high_rate
        self.devices: list[GpuDevice] = []
        self._nvml = None
        self._unsupported: set[tuple[int, str]] = set()
        self._gpm_previous: dict[int, object] = {}
        self._nvlink_previous: dict[int, tuple[float, int, int]] = {}
        self._buffer_seen_us: dict[int, int] = {}

    def open(self) -> list[GpuDevice]:
        """Initialises NVML and finds the GPUs; raises ``NvmlUnavailable`` saying why."""
        try:
            import pynvml
        except ImportError as error:
            raise NvmlUnavailable(f"pynvml is not installed ({error})") from None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as error:
            raise NvmlUnavailable(
                f"NVML could not start ({type(error).__name__}: {error}); no NVIDIA driver?"
            ) from None
        self._nvml = pynvml
        try:
            self.devices = [self._device(gpu, key) for gpu, key in enumerate(self._keys())]
        except pynvml.NVMLError as error:
            self.close()
            raise NvmlUnavailable(f"NVML could not find the GPUs: {error}") from None
        if not self.devices:
            self.close()
            raise NvmlUnavailable("NVML found no GPU")
        return self.devices

    def _keys(self) -> list:
        if self.pci_bus_ids:
            return [("pci", bus_id) for bus_id in self.pci_bus_ids]
        if self.identities is not None:
            return [("id", identity) for identity in self.identities]
        return [("id", index) for index in range(self._nvml.nvmlDeviceGetCount())]

    def _device(self, gpu: int, key) -> GpuDevice:
        nvml = self._nvml
        kind, value = key
        if kind == "pci":
            handle = nvml.nvmlDeviceGetHandleByPciBusId(str(value).encode())
        elif isinstance(value, int):
            handle = nvml.nvmlDeviceGetHandleByIndex(value)
        else:
            handle = nvml.nvmlDeviceGetHandleByUUID(str(value).encode())
        try:
            gpm = bool(nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
        except (nvml.NVMLError, AttributeError):
            gpm = False
        return GpuDevice(
            gpu=gpu,
            nvml_index=int(nvml.nvmlDeviceGetIndex(handle)),
            name=_text(nvml.nvmlDeviceGetName(handle)),
            uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            pci_bus_id=_text(nvml.nvmlDeviceGetPciInfo(handle).busId),
            gpm=gpm,
            handle=handle,
        )

    def read(self) -> list[dict]:
        """One reading per GPU (``time``, ``gpu``, ``sampling="poll"`` and
        ``READING_FIELDS``), followed by the driver's buffered utilization samples since
        the last read (``sampling="buffer"``, ``util_gpu`` only, driver timestamps)."""
        now = time.time()
        readings = []
        for device in self.devices:
            reading = {"time": now, "gpu": device.gpu, "sampling": "poll"}
            reading.update(self._poll(device, now))
            readings.append(reading)
            if self.high_rate:
                readings.extend(self._buffered(device))
        return readings

    def _optional(self, device: GpuDevice, metric: str, read):
        """``read()``, or None from now on for a metric this GPU does not support."""
        if (device.gpu, metric) in self._unsupported:
            return None
        try:
            return read()
        except self._nvml.NVMLError as error:
            self._unsupported.add((device.gpu, metric))
            logger.info("GPU %d: %s not available (%s)", device.gpu, metric, error)
            return None

    def _poll(self, device: GpuDevice, now: float) -> dict:
        nvml, handle = self._nvml, device.handle
        rates = self._optional(
            device, "utilization", lambda: nvml.nvmlDeviceGetUtilizationRates(handle)
        )
        memory = self._optional(device, "memory", lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        power = self._optional(device, "power", lambda: nvml.nvmlDeviceGetPowerUsage(handle))
        clock = self._optional(
            device, "sm_clock", lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)
        )
        temperature = self._optional(
            device,
            "temperature",
            lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU),
        )
        reading = {
            "util_gpu": None if rates is None else float(rates.gpu),
            "util_memory": None if rates is None else float(rates.memory),
            "mem_used_gb": None if memory is None else memory.used / GIB,
            "mem_total_gb": None if memory is None else memory.total / GIB,
            "power_w": None if power is None else power / 1000.0,
            "sm_clock_mhz": None if clock is None else float(clock),
            "temperature_c": None if temperature is None else float(temperature),
        }
        reading.update(self._gpm(device) if device.gpm else self._nvlink_counters(device, now))
        return reading

    def _gpm(self, device: GpuDevice) -> dict:
        """GPM metrics between the previous read and this one (none on the first)."""
        nvml = self._nvml
        sample = self._optional(
            device, "gpm", lambda: nvml.nvmlGpmSampleGet(device.handle, nvml.nvmlGpmSampleAlloc())
        )
        previous, self._gpm_previous[device.gpu] = self._gpm_previous.get(device.gpu), sample
        if sample is None or previous is None:
            return {}
        metrics = {
            nvml.NVML_GPM_METRIC_SM_UTIL: "sm_activity",
            nvml.NVML_GPM_METRIC_SM_OCCUPANCY: "sm_occupancy",
            nvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: "tensor_activity",
            nvml.NVML_GPM_METRIC_DRAM_BW_UTIL: "dram_bw_util",
            nvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: "nvlink_rx_gbps",
            nvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: "nvlink_tx_gbps",
        }
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(metrics)
        request.sample1, request.sample2 = previous, sample
        for slot, metric_id in enumerate(metrics):
            request.metrics[slot].metricId = metric_id
        result = self._optional(device, "gpm", lambda: nvml.nvmlGpmMetricsGet(request))
        nvml.nvmlGpmSampleFree(previous)
        values = {}
        for slot, name in enumerate(metrics.values()):
            metric = None if result is None else result.metrics[slot]
            if metric is not None and metric.nvmlReturn == nvml.NVML_SUCCESS:
                value = float(metric.value)
                values[name] = value * 1.048576 / 1000 if name.startswith("nvlink") else value
        return values

    def _nvlink_counters(self, device: GpuDevice, now: float) -> dict:
        """NVLink throughput from the cumulative KiB counters (GPUs without GPM)."""
        nvml = self._nvml
        fields = [
            nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
            nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
        ]
        values = self._optional(
            device, "nvlink", lambda: nvml.nvmlDeviceGetFieldValues(device.handle, fields)
        )
        if values is None or any(value.nvmlReturn != nvml.NVML_SUCCESS for value in values):
            return {}
        rx_kib, tx_kib = (int(value.value.ullVal) for value in values)
        previous = self._nvlink_previous.get(device.gpu)
        self._nvlink_previous[device.gpu] = (now, rx_kib, tx_kib)
        if previous is None or now <= previous[0]:
            return {}
        seconds = now - previous[0]
        return {
            "nvlink_rx_gbps": (rx_kib - previous[1]) * 1024 / seconds / 1e9,
            "nvlink_tx_gbps": (tx_kib - previous[2]) * 1024 / seconds / 1e9,
        }

    def _buffered(self, device: GpuDevice) -> list[dict]:
        nvml = self._nvml
        seen = self._buffer_seen_us.get(device.gpu, int(time.time() * 1e6))
        result = self._optional(
            device,
            "utilization buffer",
            lambda: nvml.nvmlDeviceGetSamples(
                device.handle, nvml.NVML_GPU_UTILIZATION_SAMPLES, seen
            ),
        )
        if not result:
            return []
        _, samples = result
        fresh = [sample for sample in samples if sample.timeStamp > seen]
        if fresh:
            self._buffer_seen_us[device.gpu] = max(sample.timeStamp for sample in fresh)
        else:
            self._buffer_seen_us.setdefault(device.gpu, seen)
        return [
            {
                "time": sample.timeStamp / 1e6,
                "gpu": device.gpu,
                "sampling": "buffer",
                "util_gpu": float(sample.sampleValue.uiVal),
            }
            for sample in fresh
        ]

    def close(self) -> None:
        if self._nvml is None:
            return
        for sample in self._gpm_previous.values():
            if sample is not None:
                with contextlib.suppress(self._nvml.NVMLError):
                    self._nvml.nvmlGpmSampleFree(sample)
        self._gpm_previous.clear()
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as error:
            logger.debug("nvmlShutdown failed: %s", error)
        self._nvml = None
