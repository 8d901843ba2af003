"""The GPU path on traces with the schema and names XLA's CUPTI collector writes
(tests/helpers/gpu_traces.py), expected numbers computed by hand in the docstrings."""

import re

import pytest

from keras_dp_tools.analysis import analyze_trace, analyze_xspace
from keras_dp_tools.analysis.breakdown.classify import Kind, classify_device_event
from keras_dp_tools.analysis.breakdown.gpu_trace import (
    LINK_PEAK_GBPS,
    UnusableTraceError,
    nccl_collective,
)
from keras_dp_tools.analysis.trace.xspace import TraceEvent
from tests.helpers.gpu_traces import (
    COMPUTE,
    GEMM,
    GRADIENT_BYTES,
    NCCL,
    PEER,
    two_gpu_run,
)


def rows_by(frame):
    return {(row["step"], row["replica"]): row for row in frame.to_dict("records")}


def test_late_kernels_count_in_their_launching_step_and_d2d_is_not_communication(gpu_trace):
    """Step 1 lasts until its last launched kernel ends: 0-11 ms.

    GPU 0: compute [1,5]+[9,11] = 6.0; all-reduce [5.5,9] = 3.5, wait [5.5,7] = 1.5,
    transfer 2.0, none hidden by compute; busy [1,5]+[5.5,11] = 9.5; input [0,0.4] = 0.4;
    other 11 - 9.5 - 0.4 = 1.1 (the D2D copy and the idle 0.4-1.0).
    GPU 1: compute [1,6.5]+[9.5,10.5] = 6.5 (the second stream's [2,3] overlaps);
    communication NCCL [7,9] + P2P [9,9.5] = 2.5, no wait (arrived last); busy
    [1,6.5]+[7,10.5] = 9.0; other 2.0.
    Step 2 (10-20): GPU 0 compute [11,15]+[17,18]+[19,19.5] (unlinked, by time) = 5.5;
    GPU 1 [10.5,14]+[17,18] = 4.5 (step 1's Adam 9.5-10.5 is not in it); both
    all-reduce [15,17] = 2.0 with no wait.
    """
    breakdown = analyze_xspace(gpu_trace_space(gpu_trace), devices=["/gpu:0", "/gpu:1"])
    rows = rows_by(breakdown.replicas)
    assert sorted(rows) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    expected = {
        (1, 0): dict(step_ms=11.0, compute_ms=6.0, allreduce_ms=3.5, sync_wait_ms=1.5),
        (1, 1): dict(step_ms=11.0, compute_ms=6.5, allreduce_ms=2.5, sync_wait_ms=0.0),
        (2, 0): dict(step_ms=10.0, compute_ms=5.5, allreduce_ms=2.0, sync_wait_ms=0.0),
        (2, 1): dict(step_ms=10.0, compute_ms=4.5, allreduce_ms=2.0, sync_wait_ms=0.0),
    }
    for key, values in expected.items():
        for column, value in values.items():
            assert rows[key][column] == pytest.approx(value), (key, column)
    gpu0 = rows[(1, 0)]
    assert gpu0["transfer_ms"] == pytest.approx(2.0)
    assert gpu0["exposed_allreduce_ms"] == pytest.approx(3.5)
    assert gpu0["input_ms"] == pytest.approx(0.4)
    assert gpu0["other_ms"] == pytest.approx(1.1)
    assert rows[(1, 1)]["transfer_ms"] == pytest.approx(2.5)
    assert rows[(1, 1)]["other_ms"] == pytest.approx(2.0)
    for row in rows.values():  # the four exclusive parts still fill the step
        parts = row["compute_ms"] + row["exposed_allreduce_ms"] + row["input_ms"]
        assert parts + row["other_ms"] == pytest.approx(row["step_ms"])


def gpu_trace_space(GpuTrace):
    return two_gpu_run(GpuTrace).space


def test_bandwidth_comes_from_allreduce_kernels_only(gpu_trace):
    """8 MB over the all-reduce kernels' transfer: GPU 0 step 1, 3.5 - 1.5 wait = 2 ms:
    algbw 4 GB/s, busbw 4 * 2(2-1)/2 = 4 GB/s. GPU 1: NCCL 2 ms (the P2P copy's 0.5 ms
    does not count) gives 4 GB/s too."""
    breakdown = analyze_xspace(
        gpu_trace_space(gpu_trace), devices=["/gpu:0", "/gpu:1"], allreduce_bytes=GRADIENT_BYTES
    )
    rows = rows_by(breakdown.replicas)
    for replica in (0, 1):
        assert rows[(1, replica)]["algbw_gbps"] == pytest.approx(4.0)
        assert rows[(1, replica)]["busbw_gbps"] == pytest.approx(4.0)
        assert rows[(1, replica)]["bandwidth_note"] is None
    # The step shows the replicas' (4.0), not 8 MB over the mean transfer including the
    # P2P copy ((2.0 + 2.5) / 2 ms: 3.6 GB/s).
    assert breakdown.steps.set_index("step").loc[1, "busbw_gbps"] == pytest.approx(4.0)


def test_bandwidth_above_the_link_peak_is_flagged_not_printed(gpu_trace):
    """On PCIe 3 (16 GB/s), 80 MB in 2 ms (busbw 40 GB/s) is impossible."""
    breakdown = analyze_xspace(
        gpu_trace_space(gpu_trace),
        devices=["/gpu:0", "/gpu:1"],
        allreduce_bytes=10 * GRADIENT_BYTES,
        link_peak_gbps=LINK_PEAK_GBPS["pcie3"],
    )
    row = rows_by(breakdown.replicas)[(1, 0)]
    assert row["busbw_gbps"] != row["busbw_gbps"]  # NaN: not shown
    assert "exceeds the link peak 16 GB/s" in row["bandwidth_note"]
    step = breakdown.steps.set_index("step").loc[1]
    assert step["busbw_gbps"] != step["busbw_gbps"]
    assert "exceeds the link peak" in step["bandwidth_note"]


def test_copies_alone_give_no_bandwidth(gpu_trace):
    """A 20 us peer copy is communication, but not a collective with known bytes."""
    trace = gpu_trace().step(1, 0.0, 1.0)
    for gpu in (0, 1):
        trace.kernel(gpu, COMPUTE, GEMM, 0.1, 0.5, 10 + gpu, launched_at=0.01)
        trace.copy(gpu, PEER, "P2P", 0.5, 0.52, 20 + gpu, launched_at=0.02)
    breakdown = analyze_xspace(trace.space, allreduce_bytes=GRADIENT_BYTES)
    row = breakdown.replicas.iloc[0]
    assert row["allreduce_ms"] == pytest.approx(0.02)
    assert row["busbw_gbps"] != row["busbw_gbps"]
    assert row["bandwidth_note"] == "no all-reduce collective ran in this step"


def test_one_gpu_has_no_allreduce_and_no_bandwidth(gpu_trace):
    """One GPU: gemm 1-4, a D2D copy 4-5 and a D2H copy 5-5.5 are no communication."""
    trace = gpu_trace().step(3, 0.0, 6.0)
    trace.kernel(0, COMPUTE, GEMM, 1.0, 4.0, 1, launched_at=0.1)
    trace.copy(0, COMPUTE, "D2D", 4.0, 5.0, 2, launched_at=0.2)
    trace.copy(0, COMPUTE, "D2H", 5.0, 5.5, 3, launched_at=0.3)
    breakdown = analyze_xspace(trace.space, devices=["/gpu:0"], allreduce_bytes=GRADIENT_BYTES)
    row = breakdown.replicas.iloc[0]
    assert row["compute_ms"] == pytest.approx(3.0)
    assert row["allreduce_ms"] == 0 and row["sync_wait_ms"] == 0
    assert row["other_ms"] == pytest.approx(3.0)
    assert row["busbw_gbps"] != row["busbw_gbps"]
    assert row["bandwidth_note"] == "one replica: nothing to all-reduce"


def test_missing_device_events_fail_with_the_reason(gpu_trace):
    no_planes = gpu_trace().step(1, 0.0, 1.0)
    with pytest.raises(UnusableTraceError, match=r"no GPU planes.*CUPTI"):
        analyze_xspace(no_planes.space, devices=["/gpu:0", "/gpu:1"])

    empty = gpu_trace().step(1, 0.0, 1.0)
    empty.builder.gpu(0), empty.builder.gpu(1)  # planes without activity
    empty.derived_line(0, "fusion", 0.0, 1.0)
    with pytest.raises(UnusableTraceError, match="hold no device events"):
        analyze_xspace(empty.space, devices=["/gpu:0", "/gpu:1"])


def test_tf_ids_that_differ_from_cuda_ordinals_are_named(gpu_trace):
    """set_visible_devices([gpus[1]]) makes TF's /gpu:0 CUDA device 1: the trace's
    events are on /device:GPU:1 while the strategy says /gpu:0."""
    trace = gpu_trace().step(1, 0.0, 1.0)
    trace.builder.gpu(0)
    trace.kernel(1, COMPUTE, GEMM, 0.1, 0.5, 1, launched_at=0.01)
    with pytest.raises(UnusableTraceError, match="set_visible_devices"):
        analyze_xspace(trace.space, devices=["/job:localhost/replica:0/task:0/device:GPU:0"])


def test_cpu_strategy_on_a_gpu_machine_reads_the_host_ops(gpu_trace):
    """GPU planes with activity (TF's own kernels) do not turn a CPU strategy's trace
    into a GPU one: the CPU ops are the replicas' work (compute 1-3 and 2-5)."""
    trace = gpu_trace().step(1, 0.0, 6.0)
    trace.kernel(0, COMPUTE, GEMM, 0.1, 5.9, 1, launched_at=0.01)
    trace.host_op("tf_Compute/1", "sequential/dense/MatMul:_MklNativeFusedMatMul", 1.0, 3.0)
    trace.host_op("tf_Compute/2", "replica_1/sequential/dense/MatMul:MatMul", 2.0, 5.0)
    rows = analyze_xspace(trace.space, devices=["/cpu:0", "/cpu:1"]).replicas
    assert rows["compute_ms"].tolist() == pytest.approx([2.0, 3.0])


def test_device_event_kinds_follow_cupti_names():
    def kind(name, **stats):
        return classify_device_event(TraceEvent("/device:GPU:0", "Stream #7", name, 0, 1, stats))

    assert kind("MemcpyD2D") is Kind.MEMCPY  # within one GPU: XProf's device-to-device
    assert kind("MemcpyD2H") is Kind.MEMCPY
    assert kind("MemcpyP2P") is Kind.COPY  # between GPUs: communication
    assert kind("MemcpyH2D") is Kind.INPUT
    assert kind("void ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long)") is (
        Kind.COLLECTIVE
    )
    assert kind(GEMM) is Kind.COMPUTE


@pytest.mark.parametrize(
    ("name", "collective"),
    [
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "all_reduce"),
        ("ncclKernel_AllReduce_RING_LL_Sum_float", "all_reduce"),
        ("void ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevComm*)", "reduce_scatter"),
        ("ncclDevKernel_AllGather_RING_LL", "all_gather"),
        ("ncclDevKernel_Broadcast_RING_LL", "broadcast"),
        ("ncclDevKernel_SendRecv", "send_recv"),
        ("ncclDevKernel_Reduce_Sum_f32_RING_LL", "reduce"),
        ("void cutlass::Kernel<gemm>(Params)", None),
    ],
)
def test_nccl_kernel_names_say_the_collective(name, collective):
    assert nccl_collective(name) == collective


def test_gathers_are_not_counted_as_allreduce_bandwidth(gpu_trace):
    """All-gather kernels (2 ms) are communication but carry no all-reduce bytes."""
    trace = gpu_trace().step(1, 0.0, 3.0)
    for gpu in (0, 1):
        trace.kernel(gpu, NCCL, "ncclDevKernel_AllGather_RING_LL", 0.5, 2.5, 10 + gpu, 0.1)
    row = analyze_xspace(trace.space, allreduce_bytes=GRADIENT_BYTES).replicas.iloc[0]
    assert row["allreduce_ms"] == pytest.approx(2.0)
    assert row["bandwidth_note"] == "no all-reduce collective ran in this step"


def test_xprof_beside_ours_on_the_same_trace(gpu_trace, tmp_path):
    """XProf groups device events into steps by the same launch links, and merges both
    GPUs into one timeline where compute outranks collectives.

    Step 1: XProf's step also ends with the late Adam kernel at 11 ms: 11.0 ms like
    ours. Its collective time is where an NCCL kernel runs and no GPU computes: NCCL on
    [5.5,9], compute on [1,6.5] and [9,11], so [6.5,9] = 2.5 ms, against our per-GPU
    exposed all-reduce of 3.5 and 2.5 (mean 3.0). XProf 2.24 reads CUPTI's copy names
    (MemcpyD2D, MemcpyP2P, MemcpyH2D) as compute: its device-to-device time stays 0.
    Step 2: NCCL [15,17] with no compute anywhere: 2.0 ms for both tools.
    """
    path = two_gpu_run(gpu_trace).write(tmp_path)
    steps = analyze_trace(path, devices=["/gpu:0", "/gpu:1"]).steps.set_index("step")
    assert steps.loc[1, "step_ms"] == pytest.approx(11.0)
    assert steps.loc[1, "xprof_step_ms"] == pytest.approx(11.0)
    assert steps.loc[1, "exposed_allreduce_ms"] == pytest.approx(3.0)
    assert steps.loc[1, "xprof_collectives_ms"] == pytest.approx(2.5)
    assert steps.loc[1, "xprof_device_to_device_ms"] == 0
    assert steps.loc[2, "exposed_allreduce_ms"] == pytest.approx(2.0)
    assert steps.loc[2, "xprof_collectives_ms"] == pytest.approx(2.0)


def test_window_without_device_events_is_marked_failed(tmp_path, keras, strategy4, monkeypatch):
    """A real capture with no device events (this machine has no GPU, as a run without
    CUPTI would record), from a strategy whose devices are GPUs: the window fails with
    the reason, and training goes on."""
    import keras_dp_tools as kdt
    from keras_dp_tools.capture import data_parallel_profiler
    from tests.helpers.training import dense_model, fit, iterations

    gpus = ["/job:localhost/replica:0/task:0/device:GPU:0", "/gpu:1"]
    monkeypatch.setattr(data_parallel_profiler, "strategy_devices", lambda strategy: gpus)
    model = dense_model(keras, strategy4)
    profiler = kdt.DataParallelProfiler(tmp_path, start_step=2, window=3)
    with pytest.warns(kdt.MeasurementWarning, match="no GPU planes"):
        fit(model, [profiler])

    assert iterations(model) == 7
    window = kdt.Report.load(tmp_path).windows.iloc[0]
    assert window["status"] == "failed"
    assert "UnusableTraceError" in window["reason"] and "CUPTI" in window["reason"]


# two_gpu_run's rows, computed by hand in the docstrings above: (step, replica) ->
# step, compute, all-reduce, sync wait, input and other ms.
TWO_GPU_ROWS = {
    (1, 0): (11.0, 6.0, 3.5, 1.5, 0.4, 1.1),
    (1, 1): (11.0, 6.5, 2.5, 0.0, 0.0, 2.0),
    (2, 0): (10.0, 5.5, 2.0, 0.0, 0.0, 2.5),
    (2, 1): (10.0, 4.5, 2.0, 0.0, 0.0, 3.5),
}


def assert_two_gpu_rows(replicas):
    columns = ["step_ms", "compute_ms", "allreduce_ms", "sync_wait_ms", "input_ms", "other_ms"]
    rows = rows_by(replicas)
    assert sorted(rows) == sorted(TWO_GPU_ROWS)
    for key, expected in TWO_GPU_ROWS.items():
        assert [rows[key][column] for column in columns] == pytest.approx(expected), key


def analysed(space, tmp_path, from_file):
    devices = ["/gpu:0", "/gpu:1"]
    if not from_file:
        return analyze_xspace(space, devices=devices).replicas
    path = tmp_path / "plugins" / "profile" / "2026_11_29_10_00_00" / "host.xplane.pb"
    path.parent.mkdir(parents=True)
    path.write_bytes(space.SerializeToString())  # read back streamed, line by line
    return analyze_trace(path, devices=devices, xprof=False).replicas


@pytest.mark.parametrize("from_file", [False, True])
def test_a_first_line_at_timestamp_zero_does_not_move_the_origin(gpu_trace, tmp_path, from_file):
    """A line without events at ``timestamp_ns`` 0 first in the host plane, the others
    at a Unix time (1.7e18 ns; 1.7e21 ps from 0 overflows int64): the rows are the
    hand-computed ones. (This failed with OverflowError before.)"""
    space = two_gpu_run(gpu_trace).space
    host = next(plane for plane in space.planes if plane.name == "/host:CPU")
    lines = [type(line)() for line in host.lines]
    for copy, line in zip(lines, host.lines, strict=True):
        copy.CopyFrom(line)
    del host.lines[:]
    host.lines.add(id=99, name="empty", timestamp_ns=0)
    host.lines.extend(lines)
    assert_two_gpu_rows(analysed(space, tmp_path, from_file))


@pytest.mark.parametrize("from_file", [False, True])
def test_a_clock_counted_from_zero_gives_the_same_rows(gpu_trace, tmp_path, from_file):
    """Every line starts at its first event on a clock whose zero is the first event:
    the host's python line is at ``timestamp_ns`` 0 (a field the file then omits), the
    GPU streams at 0, 1, 2, 5.5, 7 and 9 ms. Same hand-computed rows."""
    from tests.helpers.gpu_traces import rebase

    space = rebase(two_gpu_run(gpu_trace).space, 0)
    timestamps = {line.timestamp_ns for plane in space.planes for line in plane.lines}
    assert 0 in timestamps and 5_500_000 in timestamps  # the lines start apart
    assert_two_gpu_rows(analysed(space, tmp_path, from_file))


def test_lines_on_different_clocks_are_refused_with_the_reason(gpu_trace):
    """Device lines counted from 0 but host lines at a Unix time (1.7e18 ns, ~19,700
    days apart) cannot be put on one timeline: refused, not guessed."""
    from tests.helpers.gpu_traces import rebase
    from tests.helpers.xplane_builder import LINE_START_NS

    space = rebase(two_gpu_run(gpu_trace).space, 0)
    for plane in space.planes:
        if plane.name == "/host:CPU":
            for line in plane.lines:
                line.timestamp_ns += LINE_START_NS
    with pytest.raises(UnusableTraceError, match=r"19,676 days apart.*not on one clock"):
        analyze_xspace(space, devices=["/gpu:0", "/gpu:1"])


def test_line_timestamps_of_a_streamed_file_in_any_field_order(tf, tmp_path, monkeypatch):
    """``line_timestamps`` walks a streamed line's fields without parsing it (XLine is
    not even reachable) and agrees with protobuf: a timestamp before or after the
    events, two of them (the last wins), none (0, omitted on the wire), an unknown
    group field; a line without events is left out."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    from keras_dp_tools.analysis.trace import xspace

    def field(number, payload):  # a length-delimited field
        size, length = len(payload), b""
        while size >= 0x80:
            length, size = length + bytes([size & 0x7F | 0x80]), size >> 7
        return bytes([number << 3 | 2]) + length + bytes([size]) + payload

    def timestamp(value):
        return xplane_pb2.XLine(timestamp_ns=value).SerializeToString()

    event = field(
        4, xplane_pb2.XEvent(metadata_id=1, offset_ps=5, duration_ps=7).SerializeToString()
    )
    group = bytes([15 << 3 | 3, 1 << 3, 1, 15 << 3 | 4])  # field 15: {field 1: 1}
    ordered = xplane_pb2.XLine(id=1, name="a", timestamp_ns=1 << 60)
    ordered.events.add(metadata_id=1, offset_ps=5, duration_ps=7)
    lines = [
        ordered.SerializeToString(),
        event + timestamp(123),
        timestamp(-5) + event * 3 + group + timestamp(77) + event,  # the last wins
        event * 2,  # at 0
        xplane_pb2.XLine(id=3, name="empty", timestamp_ns=9).SerializeToString(),
    ]
    plane = xplane_pb2.XPlane(id=1, name="/host:CPU").SerializeToString()
    for line in lines:
        plane += field(3, line)
    path = tmp_path / "t.xplane.pb"
    path.write_bytes(field(1, plane))
    parsed = xplane_pb2.XSpace.FromString(path.read_bytes()).planes[0]
    assert [line.timestamp_ns for line in parsed.lines] == [1 << 60, 123, 77, 0, 9]
    streamed = xspace.stream_xspace(path).planes[0]
    monkeypatch.setattr(xspace, "_xplane_pb2", None)  # no line is parsed
    assert xspace.line_timestamps(streamed) == [1 << 60, 123, 77, 0]
    assert xspace.line_timestamps(parsed) == [1 << 60, 123, 77, 0]


@pytest.mark.parametrize("plane_name", ["/device:GPU:0", "/host:CPU"])
def test_a_time_beyond_int64_is_refused_naming_its_plane_and_line(gpu_trace, plane_name):
    """An event lasting 2**63-1 ps ends past what int64 picoseconds hold: numpy would
    wrap its end to a negative time and drop the event silently; the trace is refused
    with the plane, the line and what to do."""
    space = two_gpu_run(gpu_trace).space
    plane = next(plane for plane in space.planes if plane.name == plane_name)
    line, event = next((ln, e) for ln in plane.lines for e in ln.events if e.offset_ps > 0)
    event.duration_ps = (1 << 63) - 1  # ends after 2**63 - 1 ps from the trace's start
    expected = rf"plane {plane_name}, line '{re.escape(line.name)}'.*Capture the window again"
    with pytest.raises(UnusableTraceError, match=expected):
        analyze_xspace(space, devices=["/gpu:0", "/gpu:1"])


def test_correlation_ids_on_event_metadata_link_launches_and_kernels(gpu_trace):
    """Each host launch and each device event gets its own event metadata carrying its
    ``correlation_id`` (under a second stat metadata of that name), the events none:
    ``plane_events`` gives every event the same stats, and so the rows are the
    hand-computed ones (the late Adam kernels still count in their launching step)."""
    space = two_gpu_run(gpu_trace).space
    for plane in space.planes:
        names = {key: meta.name for key, meta in plane.stat_metadata.items()}
        correlation = [key for key, name in names.items() if name == "correlation_id"]
        if not correlation:
            continue
        plane.stat_metadata[500].id = 500
        plane.stat_metadata[500].name = "correlation_id"
        for line in plane.lines:
            for event in line.events:
                own = [stat for stat in event.stats if stat.metadata_id == correlation[0]]
                if not own:
                    continue
                key = 1000 + own[0].uint64_value
                meta = plane.event_metadata[key]
                meta.CopyFrom(plane.event_metadata[event.metadata_id])
                meta.id = key
                meta.stats.add(metadata_id=500, uint64_value=own[0].uint64_value)
                event.metadata_id = key
                event.stats.remove(own[0])
    assert_two_gpu_rows(analyze_xspace(space, devices=["/gpu:0", "/gpu:1"]).replicas)


def test_device_event_kinds_match_the_parsed_events_for_any_tf_op(gpu_trace):
    """Kernels of one name whose ``tf_op`` is a string naming a collective, a ref to a
    missing stat metadata at 2**64-2 (an int64 -2 on the wire), or absent: the reader's
    kinds are those ``classify_device_event`` gives the events ``plane_events`` parses."""
    from keras_dp_tools.analysis.breakdown.classify import KIND_CODES
    from keras_dp_tools.analysis.breakdown.gpu_trace import read_device_events, stream_events
    from tests.helpers.xplane_builder import LINE_START_NS

    trace = gpu_trace().step(1, 0.0, 10.0)
    for index in range(3):
        trace.kernel(0, COMPUTE, "void k(float*)", index, index + 0.5, index + 1)
    plane = trace.builder.gpu(0)
    line = next(line for line in plane.plane.lines if line.name.startswith("Stream #"))
    op = line.events[0].stats.add(metadata_id=plane.stat_id("tf_op"))
    op.str_value = "sum/CollectiveReduceV2:CollectiveReduceV2"
    line.events[1].stats.add(metadata_id=plane.stat_id("tf_op"), ref_value=(1 << 64) - 2)
    space = trace.space
    gpu = next(plane for plane in space.planes if plane.name == "/device:GPU:0")
    expected = [KIND_CODES[classify_device_event(event)] for event in stream_events(gpu)]
    assert expected == [KIND_CODES[Kind.COLLECTIVE], *[KIND_CODES[Kind.COMPUTE]] * 2]
    origin_ps = LINE_START_NS * 1000
    assert read_device_events(gpu, origin_ps).kind.tolist() == expected


def test_lines_read_in_batches_of_any_size_give_the_same_rows(gpu_trace, monkeypatch):
    """The GPU reader decodes about ``_BATCH_BYTES`` of lines at once; a batch per line
    (1 byte) gives the hand-computed rows too."""
    from keras_dp_tools.analysis.breakdown import gpu_trace as reader

    monkeypatch.setattr(reader, "_BATCH_BYTES", 1)
    space = two_gpu_run(gpu_trace).space
    assert_two_gpu_rows(analyze_xspace(space, devices=["/gpu:0", "/gpu:1"]).replicas)
