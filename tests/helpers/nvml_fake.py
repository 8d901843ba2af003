"""An NVML-shaped stand-in for ``pynvml``, for tests on machines without a GPU.

It is the installed ``pynvml`` module (nvidia-ml-py) with only the calls into the
driver replaced: constants, error classes and the ctypes structures are pynvml's own,
and each replaced call returns what the real one returns (a filled ``c_nvmlMemory_t``,
``c_nvmlSample_t`` list, ``c_nvmlFieldValue_t`` array, the ``c_nvmlGpmMetricsGet_t``
it was given, ...), so the reader's parsing runs on real types. ``nvml_works`` says
whether the real NVML starts on this machine.
"""

from __future__ import annotations

import ctypes
import types
from dataclasses import dataclass, field

import pynvml

GIB = 1024**3


@dataclass
class FakeGpu:
    """What one GPU reports. ``unsupported`` names calls that raise
    ``NVMLError_NotSupported``; ``nvlink_kib`` is a queue of cumulative (rx, tx) KiB
    counter values, one per read; ``gpm_values`` maps GPM metric ids to values;
    ``samples`` are (timestamp µs, util %) in the driver's buffer."""

    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-0f3c2a1e-0000-0000-0000-000000000000"
    bus_id: str = "00000000:1B:00.0"
    util: tuple[int, int] = (87, 41)
    memory: tuple[int, int] = (80 * GIB, 20 * GIB)  # total, used (bytes)
    power_mw: int = 312_500
    sm_clock_mhz: int = 1980
    temperature_c: int = 63
    gpm: bool = True
    gpm_values: dict = field(default_factory=dict)
    gpm_unsupported_metrics: set = field(default_factory=set)
    nvlink_kib: list = field(default_factory=list)
    nvlink_active: tuple = (1, 1, 0)
    samples: list = field(default_factory=list)
    unsupported: set = field(default_factory=set)


def fake_pynvml(gpus: list[FakeGpu], version: str = "12.570.86") -> types.ModuleType:
    """A ``pynvml`` module whose driver calls answer from ``gpus``. The module records
    the GPM sample pairs it was asked for (``gpm_pairs``) and freed (``gpm_freed``)."""
    module = types.ModuleType("pynvml")
    module.__dict__.update({k: v for k, v in vars(pynvml).items() if not k.startswith("__")})
    module.gpm_pairs, module.gpm_freed, module.calls = [], [], []
    samples = {}  # address of an allocated GPM sample -> its allocation number

    def gpu(handle) -> FakeGpu:
        return gpus[handle.value]

    def answer(call: str, handle, value):
        module.calls.append(call)
        if call in gpu(handle).unsupported:
            raise pynvml.NVMLError_NotSupported()
        return value

    def handle_by_index(index):
        if not 0 <= index < len(gpus):
            raise pynvml.NVMLError_InvalidArgument()
        return ctypes.c_int(index)  # a real handle is an opaque pointer; ours an index

    def handle_by(attribute):
        def find(key):
            key = key.decode() if isinstance(key, bytes) else key
            for index, candidate in enumerate(gpus):
                if getattr(candidate, attribute) == key:
                    return ctypes.c_int(index)
            raise pynvml.NVMLError_NotFound()

        return find

    def utilization(handle):
        rates = pynvml.c_nvmlUtilization_t()
        rates.gpu, rates.memory = gpu(handle).util
        return answer("utilization", handle, rates)

    def memory(handle):
        info = pynvml.c_nvmlMemory_t()
        info.total, info.used = gpu(handle).memory
        info.free = info.total - info.used
        return answer("memory", handle, info)

    def pci_info(handle):
        info = pynvml.nvmlPciInfo_t()
        info.busId = gpu(handle).bus_id.encode()
        return info

    def gpm_support(handle):
        support = pynvml.c_nvmlGpmSupport_t()
        support.isSupportedDevice = int(gpu(handle).gpm)
        return support

    def gpm_alloc():
        sample = pynvml.c_nvmlGpmSample_t(pynvml.struct_c_nvmlGpmSample_t())
        samples[ctypes.addressof(sample.contents)] = len(samples)
        return sample

    def gpm_number(sample) -> int:
        return samples[ctypes.addressof(sample.contents)]

    def gpm_get(handle, sample):
        return answer("gpm", handle, sample)

    def gpm_metrics(request):
        module.gpm_pairs.append((gpm_number(request.sample1), gpm_number(request.sample2)))
        for slot in range(request.numMetrics):
            metric = request.metrics[slot]
            current = gpus[0]  # metrics get no handle: the samples carry the device
            if metric.metricId in current.gpm_unsupported_metrics:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            else:
                metric.nvmlReturn = pynvml.NVML_SUCCESS
                metric.value = current.gpm_values.get(metric.metricId, 0.0)
        return request

    def field_values(handle, field_ids):
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        counters = answer("nvlink", handle, gpu(handle).nvlink_kib.pop(0))
        for slot, field_id in enumerate(field_ids):
            values[slot].fieldId = field_id
            values[slot].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            values[slot].nvmlReturn = pynvml.NVML_SUCCESS
            values[slot].value.ullVal = counters[slot]
        return values

    def buffered_samples(handle, sample_type, last_seen_us):
        assert sample_type == pynvml.NVML_GPU_UTILIZATION_SAMPLES
        fresh = [entry for entry in gpu(handle).samples if entry[0] > last_seen_us]
        array = (pynvml.c_nvmlSample_t * len(fresh))()
        for slot, (timestamp, value) in enumerate(fresh):
            array[slot].timeStamp = timestamp
            array[slot].sampleValue.uiVal = value
        value_type = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
        return answer("samples", handle, (value_type, array[0 : len(fresh)]))

    def nvlink_state(handle, link):
        active = gpu(handle).nvlink_active
        if link >= len(active):
            raise pynvml.NVMLError_InvalidArgument()
        return answer("nvlink_state", handle, active[link])

    module.__dict__.update(
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: "570.86.15",
        nvmlSystemGetNVMLVersion=lambda: version,
        nvmlDeviceGetCount=lambda: len(gpus),
        nvmlDeviceGetHandleByIndex=handle_by_index,
        nvmlDeviceGetHandleByPciBusId=handle_by("bus_id"),
        nvmlDeviceGetHandleByUUID=handle_by("uuid"),
        nvmlDeviceGetIndex=lambda handle: handle.value,
        nvmlDeviceGetName=lambda handle: gpu(handle).name,
        nvmlDeviceGetUUID=lambda handle: gpu(handle).uuid,
        nvmlDeviceGetPciInfo=pci_info,
        nvmlGpmQueryDeviceSupport=gpm_support,
        nvmlDeviceGetUtilizationRates=utilization,
        nvmlDeviceGetMemoryInfo=memory,
        nvmlDeviceGetPowerUsage=lambda h: answer("power", h, gpu(h).power_mw),
        nvmlDeviceGetClockInfo=lambda h, clock: answer("sm_clock", h, gpu(h).sm_clock_mhz),
        nvmlDeviceGetTemperature=lambda h, sensor: answer("temperature", h, gpu(h).temperature_c),
        nvmlGpmSampleAlloc=gpm_alloc,
        nvmlGpmSampleGet=gpm_get,
        nvmlGpmMetricsGet=gpm_metrics,
        nvmlGpmSampleFree=lambda sample: module.gpm_freed.append(gpm_number(sample)),
        nvmlDeviceGetFieldValues=field_values,
        nvmlDeviceGetSamples=buffered_samples,
        nvmlDeviceGetNvLinkState=nvlink_state,
    )
    return module


def nvml_works() -> bool:
    """Whether NVML starts here (a machine with an NVIDIA driver): tests of the
    NVML-less path skip there. CUDA_VISIBLE_DEVICES does not hide GPUs from NVML."""
    from keras_dp_tools.capture.monitor.nvml_reader import NvmlReader, NvmlUnavailable

    reader = NvmlReader(high_rate=False)
    try:
        reader.open()
    except NvmlUnavailable:
        return False
    reader.close()
    return True
