"""The breakdown on traces built with the profiler's XPlane schema, checked by hand.

GPU runs cannot happen here, so GPU-shaped traces (device planes, stream lines, NCCL
kernels, host step markers) are written in the test and the expected unions and
overlaps are computed by hand in the comments.
"""

import math

import pytest

from keras_dp_tools.analysis import analyze_trace, analyze_xspace
from keras_dp_tools.analysis.breakdown.classify import (
    Kind,
    classify_device_event,
    classify_host_event,
)
from keras_dp_tools.analysis.trace.xspace import TraceEvent
from tests.helpers.cpu_traces import cpu_trace
from tests.helpers.gpu_traces import ALLREDUCE as NCCL
from tests.helpers.gpu_traces import COMPUTE_STREAM, NCCL_STREAM, two_gpu_trace


def test_gpu_step_breakdown_per_replica_is_exact(builder):
    breakdown = analyze_xspace(two_gpu_trace(builder).space, allreduce_bytes=8_000_000)
    rows = breakdown.replicas.set_index("replica")

    gpu0, gpu1 = rows.loc[0], rows.loc[1]
    assert gpu0["step"] == 7 and gpu0["step_ms"] == pytest.approx(10.0)
    # GPU 0: compute [0.5,4]+[6,6.5] = 4.0; NCCL [3,7] = 4.0, waiting for GPU 1 until 5.0.
    assert gpu0["compute_ms"] == pytest.approx(4.0)
    assert gpu0["allreduce_ms"] == pytest.approx(4.0)
    assert gpu0["sync_wait_ms"] == pytest.approx(2.0)
    assert gpu0["transfer_ms"] == pytest.approx(2.0)
    # Not under compute: [4,6] + [6.5,7] = 2.5, of which wait [4,5] = 1.0.
    assert gpu0["exposed_allreduce_ms"] == pytest.approx(2.5)
    assert gpu0["exposed_sync_wait_ms"] == pytest.approx(1.0)
    assert gpu0["exposed_transfer_ms"] == pytest.approx(1.5)
    # Input [0,0.6] outside busy [0.5,7]: 0.5. Other: 10 - 6.5 - 0.5 = 3.0.
    assert gpu0["input_ms"] == pytest.approx(0.5)
    assert gpu0["other_ms"] == pytest.approx(3.0)
    assert gpu0["comm_share"] == pytest.approx(0.15)
    assert gpu0["wait_share"] == pytest.approx(0.10)
    # 8 MB in 2.0 ms of transfer: algbw 4 GB/s; busbw = 4 * 2(2-1)/2 = 4 GB/s.
    assert gpu0["algbw_gbps"] == pytest.approx(4.0)
    assert gpu0["busbw_gbps"] == pytest.approx(4.0)

    # GPU 1 arrived last: no wait. Compute 4.5, NCCL 2.0 all exposed, input [0,0.6]
    # (H2D copy and host wait) minus busy [0.5,7] = 0.5, other 10 - 6.5 - 0.5 = 3.0.
    assert gpu1["compute_ms"] == pytest.approx(4.5)
    assert gpu1["allreduce_ms"] == pytest.approx(2.0)
    assert gpu1["sync_wait_ms"] == 0
    assert gpu1["exposed_allreduce_ms"] == pytest.approx(2.0)
    assert gpu1["input_ms"] == pytest.approx(0.5)
    assert gpu1["other_ms"] == pytest.approx(3.0)


def test_gpu_step_row_averages_replicas_and_names_the_straggler(builder):
    step = analyze_xspace(two_gpu_trace(builder).space).steps.iloc[0]
    assert step["replicas"] == 2
    assert step["compute_ms"] == pytest.approx(4.25)
    assert step["exposed_allreduce_ms"] == pytest.approx(2.25)
    assert step["sync_wait_ms"] == pytest.approx(1.0)
    assert step["max_sync_wait_ms"] == pytest.approx(2.0)
    assert step["straggler_replica"] == 1  # GPU 0 waited 2 ms for GPU 1
    assert math.isnan(step["busbw_gbps"])  # bytes unknown: no bandwidth


def test_exclusive_parts_add_up_and_wait_plus_transfer_is_allreduce(builder):
    rows = analyze_xspace(two_gpu_trace(builder).space).replicas
    parts = rows[["compute_ms", "exposed_allreduce_ms", "input_ms", "other_ms"]].sum(axis=1)
    assert parts.to_numpy() == pytest.approx(rows["step_ms"].to_numpy())
    assert (rows["sync_wait_ms"] + rows["transfer_ms"]).to_numpy() == pytest.approx(
        rows["allreduce_ms"].to_numpy()
    )


def test_gpu_planes_follow_the_strategy_device_order(builder):
    devices = ["/job:localhost/replica:0/task:0/device:GPU:1", "/gpu:0"]
    rows = analyze_xspace(two_gpu_trace(builder).space, devices=devices).replicas
    assert rows["device"].tolist() == devices
    assert rows["compute_ms"].tolist() == pytest.approx([4.5, 4.0])


def test_nth_collective_of_each_gpu_is_one_operation(builder):
    """Without instance keys, NCCL's fixed order pairs the i-th kernels of each GPU."""
    space = builder().step(1, 0.0, 10.0)
    for ordinal, (first, second) in enumerate([((1.0, 2.0), (5.0, 6.0)), ((1.5, 2.0), (4.0, 6.0))]):
        space.gpu(ordinal).event(NCCL_STREAM, NCCL, *first).event(NCCL_STREAM, NCCL, *second)
    rows = analyze_xspace(space.space).replicas.set_index("replica")
    # Pair 1: GPU 0 waits 1.0-1.5. Pair 2: GPU 1 waits 4.0-5.0.
    assert rows.loc[0, "sync_wait_ms"] == pytest.approx(0.5)
    assert rows.loc[1, "sync_wait_ms"] == pytest.approx(1.0)


def test_nccl_kernels_clipped_to_one_step_start_pair_up_by_real_start(builder):
    """GPU 0 runs two all-reduces across the step 1/2 boundary, the later-started one
    listed first. In step 2 its first kernel is the one that started first (9.0-12.0,
    clipped to 10-12), peer of GPU 1's 10.5-11: waits 10-10.5; then 9.5-11 (10-11), peer
    of 13-14: waits 10-11. Union 1.0 ms (pairing in trace order would give 2.0)."""
    space = builder().step(1, 0.0, 10.0).step(2, 10.0, 20.0)
    space.gpu(0).event(NCCL_STREAM, NCCL, 9.5, 11.0).event("Stream #21(Nccl)", NCCL, 9.0, 12.0)
    space.gpu(1).event(NCCL_STREAM, NCCL, 10.5, 11.0).event(NCCL_STREAM, NCCL, 13.0, 14.0)
    rows = analyze_xspace(space.space).replicas.set_index(["step", "replica"])
    assert rows.loc[(2, 0), "sync_wait_ms"] == pytest.approx(1.0)
    assert rows.loc[(2, 1), "sync_wait_ms"] == 0


def test_peer_copies_count_as_allreduce_without_wait(builder):
    space = builder().step(3, 0.0, 4.0)
    space.gpu(0).event("Stream #30(MemcpyP2P)", "MemcpyP2P", 1.0, 2.0)
    space.gpu(0).event(COMPUTE_STREAM, "addn_kernel", 2.0, 2.5, tf_op="CrossDeviceOps/_Recv:_Recv")
    space.gpu(1).event(COMPUTE_STREAM, "gemm", 0.0, 3.0)
    rows = analyze_xspace(space.space).replicas.set_index("replica")
    assert rows.loc[0, "allreduce_ms"] == pytest.approx(1.5)
    assert rows.loc[0, "sync_wait_ms"] == 0
    assert rows.loc[1, "allreduce_ms"] == 0


def test_cpu_replicas_from_scopes_and_collective_copies(builder):
    rows = analyze_xspace(cpu_trace(builder).space).replicas.set_index("replica")
    assert list(rows.index) == [0, 1]
    r0, r1 = rows.loc[0], rows.loc[1]
    assert r0["compute_ms"] == pytest.approx(2.5)
    assert r0["allreduce_ms"] == pytest.approx(2.5)
    assert r0["sync_wait_ms"] == pytest.approx(1.5)  # replica 1 joined at 4.0
    assert r0["other_ms"] == pytest.approx(3.0)
    assert r1["compute_ms"] == pytest.approx(4.5)  # 0.5-4.0 and 5-6
    assert r1["allreduce_ms"] == pytest.approx(1.0)
    assert r1["sync_wait_ms"] == 0


def test_host_event_classification():
    def host(name, line="tf_Compute/1"):
        return classify_host_event(TraceEvent("/host:CPU", line, name, 0, 1))

    assert host("a/replica_3/dense/BiasAdd:BiasAdd") == (Kind.COMPUTE, 3)
    assert host("a/adam/CollectiveReduceV2_2:CollectiveReduceV2") == (Kind.COLLECTIVE, 2)
    assert host("a/adam/CollectiveGatherV2:CollectiveGatherV2") == (Kind.GATHER, 0)
    # ReductionToOneDevice / CentralStorageStrategy: a top-level AddN serves all replicas.
    assert host("AddN_3:AddN") == (Kind.COPY, None)
    assert host("StatefulPartitionedCall/AddN:AddN") == (Kind.COPY, None)
    assert host("gradient_tape/sequential/dense/AddN:AddN") == (Kind.COMPUTE, 0)
    assert host("a/Add_2/_4:_Recv") == (Kind.COPY, 0)
    assert host("IteratorGetNext_3:IteratorGetNext") == (Kind.INPUT, 3)
    assert host("GetNextFromShard2") == (Kind.INPUT, 2)
    assert host("IteratorGetNextOp::DoCompute") == (Kind.INPUT, None)
    assert host("a/adam/Pow_2:Pow") == (Kind.COMPUTE, 0)
    assert host("ExecutorState::Process") is None
    assert host("train", line="python") is None


def test_device_event_classification():
    def device(name, **stats):
        return classify_device_event(TraceEvent("/device:GPU:0", "Stream #1", name, 0, 1, stats))

    assert device("ncclKernel_AllReduce_RING_LL_Sum_float") is Kind.COLLECTIVE
    assert device("MemcpyP2P") is Kind.COPY  # between GPUs; within one: tests/test_gpu_trace.py
    assert device("MemcpyHtoD") is Kind.INPUT
    assert device("custom", tf_op="x/NcclAllReduce:NcclAllReduce") is Kind.COLLECTIVE
    assert device("sgemm", tf_op="x/MatMul:MatMul") is Kind.COMPUTE


def test_our_markers_win_over_nested_tf_keras_markers(builder):
    space = builder().step(0, 0.0, 10.0, own=False).step(1, 10.0, 20.0, own=False)
    space.step(500, 0.1, 9.9).step(501, 10.1, 19.9)
    steps = analyze_xspace(space.space).steps
    assert steps["step"].tolist() == [500, 501]
    assert steps["step_ms"].tolist() == pytest.approx([9.8, 9.8])


def test_foreign_markers_are_used_when_ours_are_absent(builder):
    space = builder().step(3, 0.0, 1.0, own=False)
    assert analyze_xspace(space.space).steps["step"].tolist() == [3]


def test_trace_without_markers_gives_empty_frames(builder):
    space = builder()
    space.gpu(0).event(COMPUTE_STREAM, "gemm", 0.0, 1.0)
    breakdown = analyze_xspace(space.space)
    assert breakdown.replicas.empty and breakdown.steps.empty


def test_not_a_trace_is_a_clear_error(tmp_path, tf):
    path = tmp_path / "x.xplane.pb"
    path.write_bytes(b"\xff\xff not a proto")
    with pytest.raises(ValueError, match="not an XSpace profile"):
        analyze_trace(path)


def test_xprof_collectives_beside_ours_on_gpu_traces(builder, tmp_path):
    """XProf merges both GPUs into one timeline where compute wins: collectives count
    only where no GPU computes, [5,6] + [6.5,7] = 1.5 ms, a lower bound on our
    per-replica exposed all-reduce (2.5 and 2.0 ms, mean 2.25)."""
    path = two_gpu_trace(builder).write(tmp_path)
    step = analyze_trace(path).steps.iloc[0]
    assert step["step"] == 7
    assert step["xprof_collectives_ms"] == pytest.approx(1.5)
    assert step["exposed_allreduce_ms"] == pytest.approx(2.25)


def test_analyze_cli_shows_xprof_beside_ours_for_gpu_traces(builder, tmp_path):
    from tests.helpers.processes import run_cli

    two_gpu_trace(builder).write(tmp_path)
    result = run_cli("analyze", str(tmp_path), "--csv")

    assert result.returncode == 0, result.stderr[-2000:]
    header, row = result.stdout.splitlines()[:2]
    values = dict(zip(header.split(","), row.split(","), strict=True))
    assert values["step"] == "7" and float(values["xprof_collectives_ms"]) == 1.5
    assert float(values["exposed_allreduce_ms"]) == 2.25


def test_the_fact_keywords_are_the_run_facts_names(builder):
    # replicas_in_sync is the collective's ranks (the bus bandwidth's n), not this trace's
    # replicas: read the other way round, the two-replica trace would split into four.
    # The 0.x names (group_size, replicas) are refused like any other unknown name.
    bytes_ = 2**20
    two = analyze_xspace(cpu_trace(builder).space, allreduce_bytes=bytes_).steps
    four = analyze_xspace(cpu_trace(builder).space, allreduce_bytes=bytes_, replicas_in_sync=4)
    assert two["busbw_gbps"].notna().all()
    # nccl-tests: busbw = algbw * 2(n-1)/n, so n=4 over n=2 is 1.5.
    assert (four.steps["busbw_gbps"] / two["busbw_gbps"]).tolist() == pytest.approx([1.5])
    for name in ("replica_count", "group_size", "replicas"):
        with pytest.raises(TypeError, match=f"no run fact is called '{name}'.*replicas_in_sync"):
            analyze_xspace(cpu_trace(builder).space, **{name: 2})
