"""GPU traces as the TensorFlow profiler writes them, and what our breakdown takes from them.

The layout (XLA's CUPTI collector, ``xla/backends/profiler/gpu/cupti_collector.cc``):

* one plane ``/device:GPU:<n>`` per CUDA device ordinal ``n``; its CUPTI activity sits
  on lines ``Stream #<id>(<types>)``, e.g. ``Stream #13(Compute)`` or
  ``Stream #20(Compute,MemcpyD2D)``; other lines are derived views (XLA ops, steps,
  ``CUPTI overhead``) and are skipped;
* kernels are named by their demangled symbol (``void foo<...>(...)`` or
  ``ncclDevKernel_AllReduce_Sum_f32_RING_LL``); copies are ``MemcpyH2D``, ``MemcpyD2H``,
  ``MemcpyD2D`` (within one GPU), ``MemcpyP2P`` (between GPUs) or ``MemcpyOther``;
* every device event carries ``correlation_id``, ``context_id`` (a ``"$$<id>"``
  string), kernels ``kernel_details`` and copies ``memcpy_details`` (refs to strings);
* the host's CUDA API call that launched it (``cuLaunchKernel``, ``cuLaunchKernelEx``,
  ``cuMemcpyHtoDAsync_v2``, ...; CUPTI's driver callbacks) carries the same
  ``correlation_id`` and ``device_id``; after post-processing it sits on the
  ``/host:CPU`` plane, on the line of the thread that called it.

The host leaves a step marker (``train``) when it has launched the step's work; the GPU
often runs the last kernels (the optimizer's) after that. So a device event belongs to
the step whose marker encloses its launch; only events without that link fall back to
the time window of the marker.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from dataclasses import dataclass

from keras_dp_tools.analysis.classify import Kind, classify_device_event
from keras_dp_tools.analysis.xspace import StepMarker, TraceEvent, gpu_planes, plane_events
from keras_dp_tools.contract import gpu_ordinal

CORRELATION_STAT = "correlation_id"
STREAM_LINE_PREFIX = "Stream #"
# Host CUDA API calls (driver ``cu*`` and runtime ``cuda*``) that start device work.
_CUDA_API_CALL = re.compile(r"^cu[A-Z]|^cuda[A-Z]")

# NCCL kernel name -> collective, first match wins (ReduceScatter before Reduce...).
_NCCL_COLLECTIVES = (
    ("all_reduce", re.compile(r"all_?reduce", re.IGNORECASE)),
    ("reduce_scatter", re.compile(r"reduce_?scatter", re.IGNORECASE)),
    ("all_gather", re.compile(r"all_?gather", re.IGNORECASE)),
    ("broadcast", re.compile(r"broadcast|bcast", re.IGNORECASE)),
    ("send_recv", re.compile(r"send_?recv|_send|_recv|alltoall", re.IGNORECASE)),
    ("reduce", re.compile(r"reduce", re.IGNORECASE)),
)

# Peak unidirectional bandwidth per GPU of each link kind, GB/s (1e9 bytes/s): a bus
# bandwidth above it cannot be transfer time alone. PCIe x16 per direction; NVLink all
# links of one GPU together (V100 6x25, A100 12x25, H100 18x25, B200 18x50).
LINK_PEAK_GBPS = {
    "pcie3": 16.0,
    "pcie4": 32.0,
    "pcie5": 64.0,
    "nvlink2": 150.0,
    "nvlink3": 300.0,
    "nvlink4": 450.0,
    "nvlink5": 900.0,
}
# Without a user-given peak, no GPU link can exceed the fastest one.
DEFAULT_GPU_PEAK_GBPS = max(LINK_PEAK_GBPS.values())


class UnusableTraceError(ValueError):
    """The trace cannot be broken down for the strategy's devices; the message says why
    and what to do. A profiler window whose trace raises it is marked failed."""


@dataclass(frozen=True, slots=True)
class DeviceSpan:
    """A kernel or copy of one replica's GPU.

    ``launched_in`` is ``(step, marker start)`` of the step marker that enclosed the
    host launch, None when the trace does not link the event to a launch inside a marker.
    ``collective`` names an NCCL kernel's operation (``all_reduce``, ``all_gather``, ...).
    """

    kind: Kind
    replica: int
    start_ps: int
    end_ps: int
    launched_in: tuple[int, int] | None = None
    collective: str | None = None


def nccl_collective(name: str) -> str | None:
    """The collective an NCCL kernel runs (``all_reduce``, ``reduce_scatter``,
    ``all_gather``, ``broadcast``, ``send_recv``, ``reduce``; ``other`` if the name does
    not say); None for kernels that are not NCCL's. "nccl" may sit anywhere in the name:
    demangled names can start with ``void ``."""
    if "nccl" not in name.lower():
        return None
    for collective, pattern in _NCCL_COLLECTIVES:
        if pattern.search(name):
            return collective
    return "other"


def is_cuda_api_call(name: str) -> bool:
    """Whether a host event of this name is a CUDA API call that starts device work."""
    return _CUDA_API_CALL.match(name) is not None


def stream_events(plane) -> list[TraceEvent]:
    """The CUPTI activity of a GPU plane: events on its ``Stream #`` lines."""
    return [event for event in plane_events(plane) if event.line.startswith(STREAM_LINE_PREFIX)]


def _has_stream_events(plane) -> bool:
    """``bool(stream_events(plane))`` without reading the events."""
    return any(
        len(line.events) and (line.display_name or line.name).startswith(STREAM_LINE_PREFIX)
        for line in plane.lines
    )


def choose_gpu_planes(space, devices: Sequence[str] | None) -> list[int] | None:
    """The GPU ordinals whose planes hold the replicas' work, in replica order; None
    for a CPU-device run.

    With the strategy's ``devices``, their kind decides: CPU devices take the CPU path
    even when the trace also has GPU planes (a CPU strategy on a GPU machine). Without
    them, GPU planes that hold device events mean a GPU run.

    Raises:
        UnusableTraceError: a replica's GPU has no device events in the trace (no
            CUPTI, or TensorFlow's GPU ids differ from the CUDA ordinals the planes are
            named by), or the devices mix GPUs and CPUs.
    """
    planes = gpu_planes(space)
    busy = {ordinal for ordinal, plane in planes.items() if _has_stream_events(plane)}
    ordinals = [gpu_ordinal(device) for device in devices or ()]
    if not ordinals:
        return sorted(busy) or None
    if all(ordinal is None for ordinal in ordinals):
        return None
    if None in ordinals:
        raise UnusableTraceError(
            f"The strategy's devices mix GPUs and other devices ({list(devices)}); only "
            "all-GPU or all-CPU replicas can be broken down."
        )
    idle = [ordinal for ordinal in ordinals if ordinal not in busy]
    if idle:
        raise UnusableTraceError(_missing_events_reason(ordinals, idle, planes, busy))
    return ordinals


def _missing_events_reason(ordinals, idle, planes, busy) -> str:
    asked = ", ".join(f"GPU:{ordinal}" for ordinal in ordinals)
    missing = ", ".join(f"GPU:{ordinal}" for ordinal in idle)
    if not planes:
        return (
            f"The trace has no GPU planes although the replicas run on {asked}: the profiler "
            "recorded no device events. Is CUPTI loadable (libcupti.so on LD_LIBRARY_PATH; "
            "`keras-dp doctor` checks)?"
        )
    others = sorted(busy - set(ordinals))
    if others:
        return (
            f"No device events on {missing} (the replicas' devices), but on "
            f"{', '.join(f'GPU:{o}' for o in others)}: TensorFlow's GPU ids differ from "
            "the CUDA ordinals the trace is named by (tf.config.set_visible_devices hides "
            "GPUs from TensorFlow only). Use CUDA_VISIBLE_DEVICES to choose GPUs instead."
        )
    if not busy:
        return (
            f"The GPU planes of the trace hold no device events (replicas on {asked}): "
            "CUPTI recorded nothing. Another CUPTI client (Nsight, a second profiler) or "
            "missing permission for GPU counters can cause this; `keras-dp doctor` checks."
        )
    return (
        f"No device events on {missing} while the other replicas' GPUs have some: the "
        "profiler lost that GPU's activity, so its steps cannot be compared."
    )


def launch_markers(host_events: list[TraceEvent], markers: list[StepMarker]) -> dict[int, tuple]:
    """``correlation_id`` -> ``(step, marker start)`` for every host CUDA call inside a
    step marker. Markers do not overlap (``step_markers`` keeps one set)."""
    starts = [marker.start_ps for marker in markers]
    launches = {}
    for event in host_events:
        correlation = event.stats.get(CORRELATION_STAT)
        if correlation is None or not is_cuda_api_call(event.name):
            continue
        index = bisect.bisect_right(starts, event.start_ps) - 1
        if index >= 0 and event.start_ps < markers[index].end_ps:
            marker = markers[index]
            launches[int(correlation)] = (marker.step, marker.start_ps)
    return launches


def device_spans(space, ordinals: Sequence[int], launches: dict[int, tuple]) -> list[DeviceSpan]:
    """Kernels and copies of each replica's GPU (replica k on ``ordinals[k]``), each
    tied to the step that launched it where the trace links them."""
    planes = gpu_planes(space)
    spans = []
    for replica, ordinal in enumerate(ordinals):
        for event in stream_events(planes[ordinal]):
            correlation = event.stats.get(CORRELATION_STAT)
            launched_in = None if correlation is None else launches.get(int(correlation))
            collective = nccl_collective(event.name)
            # An all-gather is accounted apart from the all-reduce, as on CPU traces.
            kind = Kind.GATHER if collective == "all_gather" else classify_device_event(event)
            spans.append(
                DeviceSpan(kind, replica, event.start_ps, event.end_ps, launched_in, collective)
            )
    return spans


def check_bandwidth(busbw_gbps: float | None, peak_gbps: float | None) -> str | None:
    """Why a bus bandwidth cannot be shown (above the link's physical peak), or None."""
    if busbw_gbps is None or peak_gbps is None or busbw_gbps <= peak_gbps:
        return None
    return (
        f"bus bandwidth {busbw_gbps:.0f} GB/s exceeds the link peak {peak_gbps:.0f} GB/s: "
        "the collectives' time is not transfer alone (not shown)"
    )
