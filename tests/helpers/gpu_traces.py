"""GPU traces as TensorFlow's profiler saves them, for tests (no GPU needed).

The schema follows XLA's CUPTI collector (``xla/backends/profiler/gpu/cupti_collector.cc``)
after TensorFlow's post-processing (``MergeHostPlanes``):

* ``/device:GPU:<n>`` per CUDA ordinal; CUPTI activity on lines whose id is the stream
  id and whose name is ``Stream #<id>(<event types>)``, e.g. ``Stream #13(Compute,MemcpyD2D)``;
* kernels named by their demangled symbol; copies ``MemcpyH2D``/``MemcpyD2H``/
  ``MemcpyD2D``/``MemcpyP2P``; stats ``correlation_id`` (uint), ``context_id``
  (``"$$<id>"`` string), ``kernel_details`` / ``memcpy_details`` / ``tf_op`` (refs to
  stat metadata named by the value);
* the launching driver call (``cuLaunchKernel``, ``cuMemcpyHtoDAsync_v2``, ...) with the
  same ``correlation_id`` and a ``device_id``, merged onto ``/host:CPU`` on the calling
  thread's line;
* a ``Task Environment`` plane, and derived lines (``XLA Ops``) on device planes.
"""

from __future__ import annotations

from tests.helpers.xplane_builder import Ref, SpaceBuilder, Uint

KERNEL_DETAILS = "regs:64 static_shared:0 dynamic_shared:0 grid:80,1,1 block:256,1,1 occ_pct:100"
LAUNCH_LINE = "python"  # the thread that holds the step marker launches the step's work
XLA_OPS_LINE_ID = 0xDEADBEEF + 5  # tsl's kThreadIdHloOp: derived lines are >= 0xdeadbeef


def stream_line(stream: int, event_types) -> str:
    """CUPTI's name of a stream's line, e.g. ``Stream #13(Compute,MemcpyD2D)``."""
    return f"Stream #{stream}({','.join(sorted(event_types))})"


class GpuTrace:
    """``GpuTrace().step(...)``, ``.kernel(...)``, ``.copy(...)``; ``.space`` is the
    XSpace proto, ``.write(dir)`` saves it where the profiler would."""

    def __init__(self):
        self.builder = SpaceBuilder()
        self.builder.plane("Task Environment")
        self._streams: dict[tuple[int, int], set[str]] = {}

    @property
    def space(self):
        """The XSpace, each line's events in time order (outer before inner), as the
        profiler sorts them; XProf's grouping nests events by that order."""
        for plane in self.builder.space.planes:
            for line in plane.lines:
                events = sorted(line.events, key=lambda e: (e.offset_ps, -e.duration_ps))
                copies = [type(event)() for event in events]
                for copy, event in zip(copies, events, strict=True):
                    copy.CopyFrom(event)
                del line.events[:]
                line.events.extend(copies)
        return self.builder.space

    def step(self, step: int, start_ms: float, end_ms: float):
        self.builder.step(step, start_ms, end_ms)
        return self

    def host_op(self, line: str, name: str, start_ms: float, end_ms: float):
        self.builder.host().event(line, name, start_ms, end_ms)
        return self

    def _device_event(
        self, gpu, stream, name, start_ms, end_ms, event_type, correlation_id, launched_at, api
    ):
        plane = self.builder.gpu(gpu)
        # A stream's line is named by every event type on it: renamed as types join.
        types = self._streams.get((gpu, stream))
        if types is None:
            types = self._streams[(gpu, stream)] = {event_type}
            line = stream_line(stream, types)
            plane.line(line, line_id=stream)
        else:
            before = stream_line(stream, types)
            types.add(event_type)
            line = stream_line(stream, types)
            if line != before:
                plane.rename_line(before, line)
        stats = {} if correlation_id is None else {"correlation_id": Uint(correlation_id)}
        stats["context_id"] = "$$1"
        if event_type == "Compute":
            stats["kernel_details"] = Ref(KERNEL_DETAILS)
        else:
            size = 4 << 20
            details = f"kind_src:device kind_dst:device size:{size} dest:{gpu} async:1"
            stats["memcpy_details"] = Ref(details)
        plane.event(line, name, start_ms, end_ms, **stats)
        if launched_at is not None:
            launch = {"correlation_id": Uint(correlation_id), "device_id": Uint(gpu)}
            self.builder.host().event(LAUNCH_LINE, api, launched_at, launched_at + 0.005, **launch)
        return self

    def kernel(self, gpu, stream, name, start_ms, end_ms, correlation_id=None, launched_at=None):
        """A kernel on ``Stream #stream`` of GPU ``gpu``; with ``launched_at``, its
        ``cuLaunchKernel`` on the host at that time (same ``correlation_id``)."""
        return self._device_event(
            gpu,
            stream,
            name,
            start_ms,
            end_ms,
            "Compute",
            correlation_id,
            launched_at,
            "cuLaunchKernel",
        )

    def copy(self, gpu, stream, kind, start_ms, end_ms, correlation_id=None, launched_at=None):
        """A ``Memcpy<kind>`` (``H2D``, ``D2H``, ``D2D``, ``P2P``) as CUPTI names it."""
        name = f"Memcpy{kind}"
        return self._device_event(
            gpu,
            stream,
            name,
            start_ms,
            end_ms,
            name,
            correlation_id,
            launched_at,
            "cuMemcpyAsync",
        )

    def derived_line(self, gpu, name, start_ms, end_ms):
        """An event on a derived view (``XLA Ops``), which is not CUPTI activity."""
        plane = self.builder.gpu(gpu)
        plane.line("XLA Ops", line_id=XLA_OPS_LINE_ID)
        plane.event("XLA Ops", name, start_ms, end_ms)
        return self

    def write(self, directory):
        self.space  # noqa: B018 (sorts the lines)
        return self.builder.write(directory)


def rebase(space, epoch_ns: int):
    """``space`` with each line starting at its first event, on a clock whose zero is
    ``epoch_ns`` ns before the builder's time 0 (0: the first line's ``timestamp_ns``
    is 0, as on a profiler clock counted from the session's start). The events keep
    their times relative to each other."""
    from tests.helpers.xplane_builder import LINE_START_NS

    for plane in space.planes:
        for line in plane.lines:
            if not len(line.events):
                continue
            start_ps = (line.timestamp_ns - LINE_START_NS) * 1000
            first_ns = (start_ps + min(event.offset_ps for event in line.events)) // 1000
            line.timestamp_ns = epoch_ns + first_ns
            for event in line.events:
                event.offset_ps += start_ps - first_ns * 1000
    return space


# The kernels, streams and gradient size of two_gpu_run.
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
GEMM = "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(Params)"
ADAM = "void tensorflow::functor::ApplyAdamKernel<float>(int, float*, float*, float*)"
COMPUTE, SECOND_COMPUTE, INPUT, NCCL, PEER = 13, 15, 14, 20, 21
GRADIENT_BYTES = 8_000_000


def two_gpu_run(GpuTrace):
    """Two steps on two GPUs; markers 0-10 and 10-20 ms.

    Step 1, GPU 0: H2D input 0.0-0.4; gemm 1-5; D2D copy 5.0-5.5 (same stream);
    all-reduce 5.5-9.0, waiting for GPU 1 until 7.0; Adam kernel 9-11, after the marker.
    Step 1, GPU 1: gemm 1-6.5 and 2-3 on a second stream; idle 6.5-7.0; all-reduce 7-9;
    P2P copy 9.0-9.5; Adam 9.5-10.5, after the marker.
    Step 2: GPU 0 gemm 11-15, all-reduce 15-17, Adam 17-18, and a kernel with no
    launch link at 19.0-19.5; GPU 1 gemm 10.5-14, all-reduce 15-17, Adam 17-18.
    Outside the steps: a kernel launched at 25 that runs 25-26.
    """
    trace = GpuTrace().step(1, 0.0, 10.0).step(2, 10.0, 20.0)
    trace.copy(0, INPUT, "H2D", 0.0, 0.4, 100, launched_at=0.05)
    trace.kernel(0, COMPUTE, GEMM, 1.0, 5.0, 101, launched_at=0.2)
    trace.copy(0, COMPUTE, "D2D", 5.0, 5.5, 102, launched_at=0.3)
    trace.kernel(0, NCCL, ALLREDUCE, 5.5, 9.0, 103, launched_at=0.4)
    trace.kernel(0, COMPUTE, ADAM, 9.0, 11.0, 104, launched_at=0.5)
    trace.kernel(1, COMPUTE, GEMM, 1.0, 6.5, 201, launched_at=0.25)
    trace.kernel(1, SECOND_COMPUTE, "void relu_kernel<float>(float*)", 2.0, 3.0, 205, 0.35)
    trace.kernel(1, NCCL, ALLREDUCE, 7.0, 9.0, 203, launched_at=0.45)
    trace.copy(1, PEER, "P2P", 9.0, 9.5, 206, launched_at=0.5)
    trace.kernel(1, COMPUTE, ADAM, 9.5, 10.5, 204, launched_at=0.55)
    trace.kernel(0, COMPUTE, GEMM, 11.0, 15.0, 111, launched_at=10.2)
    trace.kernel(0, NCCL, ALLREDUCE, 15.0, 17.0, 113, launched_at=10.3)
    trace.kernel(0, COMPUTE, ADAM, 17.0, 18.0, 114, launched_at=10.4)
    trace.kernel(0, COMPUTE, "void unlinked_kernel(float*)", 19.0, 19.5)
    trace.kernel(1, COMPUTE, GEMM, 10.5, 14.0, 211, launched_at=10.2)
    trace.kernel(1, NCCL, ALLREDUCE, 15.0, 17.0, 213, launched_at=10.3)
    trace.kernel(1, COMPUTE, ADAM, 17.0, 18.0, 214, launched_at=10.4)
    trace.kernel(0, COMPUTE, GEMM, 25.0, 26.0, 120, launched_at=25.0)
    trace.derived_line(0, "fusion.1", 0.0, 20.0)  # a view of the kernels, not activity
    return trace


COMPUTE_STREAM = "Stream #13(Compute)"
NCCL_STREAM = "Stream #20(Nccl)"


def two_gpu_trace(builder):
    """One 10 ms step on 2 GPUs.

    GPU 0: compute 0.5-4.0 and 6.0-6.5; NCCL all-reduce 3.0-7.0 (starts before GPU 1's).
    GPU 1: compute 0.5-5.0; NCCL 5.0-7.0; host-to-device copy 0.0-0.3.
    Host: the input wait (IteratorGetNext) 0.0-0.6, shared by both replicas.
    Outside the step: a kernel at 12-13 ms.
    """
    space = builder().step(7, 0.0, 10.0)
    space.host().event("tf_data_iterator_get_next/1", "IteratorGetNextOp::DoCompute", 0.0, 0.6)
    gpu0, gpu1 = space.gpu(0), space.gpu(1)
    gpu0.event(
        COMPUTE_STREAM,
        "volta_sgemm_128x64_nn",
        0.5,
        4.0,
        correlation_id=1,
        tf_op="sequential/dense/MatMul:MatMul",
    )
    gpu0.event(COMPUTE_STREAM, "void relu_kernel", 6.0, 6.5, correlation_id=2)
    gpu0.event(NCCL_STREAM, ALLREDUCE, 3.0, 7.0, correlation_id=3)
    gpu0.event(COMPUTE_STREAM, "late_kernel", 12.0, 13.0)
    gpu1.event(COMPUTE_STREAM, "volta_sgemm_128x64_nn", 0.5, 5.0, correlation_id=11)
    gpu1.event(NCCL_STREAM, ALLREDUCE, 5.0, 7.0, correlation_id=12)
    gpu1.event("Stream #14(MemcpyH2D)", "MemcpyHtoD", 0.0, 0.3)
    for correlation_id, launched in [(1, 0.1), (2, 0.2), (3, 0.3), (11, 0.4), (12, 0.45)]:
        # The host launches that tie kernels to the step for XProf.
        space.host().event(
            "python", "cudaLaunchKernel", launched, launched + 0.01, correlation_id=correlation_id
        )
    return space
