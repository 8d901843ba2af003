"""The breakdown of CPU-device traces shaped as TF 2.21 builds them on real runs:
steps_per_execution loops, sparse-gradient all-gathers inside per-replica ``cond``
scopes, gradient packs, reductions to one device. Expected values are computed by
hand in the comments; every result also passes the shared consistency validator."""

import pytest

from keras_dp_tools.analysis import analyze_xspace
from tests.helpers.consistency import breakdown_problems

CALL = "StatefulPartitionedCall"


def analyze(space, **kwargs):
    breakdown = analyze_xspace(space.space, **kwargs)
    assert breakdown_problems(breakdown.replicas, ranks=kwargs.get("replicas_in_sync")) == []
    assert breakdown_problems(breakdown.steps) == []
    return breakdown


def collective(host, line, name, start, end, instance, iteration=0, op="CollectiveReduceV2"):
    # The stats a real CollectiveReduceV2 / CollectiveGatherV2 event carries.
    host.event(
        line,
        f"{name}:{op}",
        start,
        end,
        step_id=-77,
        iter_id=iteration,
        frame_id=5 if iteration is not None else 0,
        instance_key=instance,
        group_key=1,
    )


def loop_trace(builder, iterations):
    """A tf_keras call of ``iterations`` steps on 2 replicas (one step per 10 ms).

    In iteration i (offset 10i): replica 0 computes 0-4 and enters the all-reduce at 4,
    replica 1 computes 1-6 and enters at 6; both end at 8. All all-reduces share
    instance_key 102 and differ in iter_id, as in a real steps_per_execution capture.
    """
    space = builder().step(8, 0.0, 10.0 * iterations)
    host = space.host()
    for i in range(iterations):
        t = 10.0 * i
        host.event(
            "tf_Compute/1", "while/body/_1/while/sequential/dense/MatMul:_MklMatMul", t, t + 4
        )
        host.event(
            "tf_Compute/2",
            "while/body/_1/while/replica_1/sequential/dense/MatMul:_MklMatMul",
            t + 1,
            t + 6,
        )
        collective(
            host, "collective_ops/1", "while/body/_1/while/CollectiveReduceV2", t + 4, t + 8, 102, i
        )
        collective(
            host,
            "collective_ops/2",
            "while/body/_1/while/CollectiveReduceV2_1",
            t + 6,
            t + 8,
            102,
            i,
        )
    return space


def test_steps_per_execution_pairs_peers_by_iteration_and_reports_per_step(builder):
    breakdown = analyze(loop_trace(builder, 4), allreduce_bytes=8_000_000)
    rows = breakdown.replicas.set_index("replica")
    r0, r1 = rows.loc[0], rows.loc[1]
    # Four iterations found from iter_id; every time per step (the call is 40 ms).
    assert (rows["steps"] == 4).all()
    assert r0["step_ms"] == pytest.approx(10.0)
    # Replica 0 waits 4-6 in each iteration (paired with the same iteration's peer;
    # pairing all four by instance_key alone would make it wait for the last one).
    assert r0["allreduce_ms"] == pytest.approx(4.0)
    assert r0["sync_wait_ms"] == pytest.approx(2.0)
    assert r1["sync_wait_ms"] == 0
    assert r0["compute_ms"] == pytest.approx(4.0)
    # Per-step bytes, the row's k x bytes, and bandwidth from matching bytes and time:
    # 8 MB in 2 ms of transfer per step: 4 GB/s; busbw = 4 * 2(2-1)/2.
    assert r0["allreduce_bytes"] == 8_000_000 and r0["row_bytes"] == 32_000_000
    assert r0["algbw_gbps"] == pytest.approx(4.0) and r0["busbw_gbps"] == pytest.approx(4.0)


def test_one_call_of_four_steps_equals_four_calls_of_one(builder):
    looped = analyze(loop_trace(builder, 4), allreduce_bytes=8_000_000).steps.iloc[0]
    single = analyze(loop_trace(builder, 1), allreduce_bytes=8_000_000).steps.iloc[0]
    for column in ["step_ms", "compute_ms", "allreduce_ms", "sync_wait_ms", "comm_share",
                   "wait_share", "allreduce_bytes", "busbw_gbps"]:  # fmt: skip
        assert looped[column] == pytest.approx(single[column]), column


def test_steps_covered_given_by_the_callback_win_over_iterations(builder):
    rows = analyze(loop_trace(builder, 4), steps_covered={8: 2}).replicas
    assert (rows["steps"] == 2).all() and rows["step_ms"].iloc[0] == pytest.approx(20.0)


def embedding_trace(builder):
    """One step on 2 replicas of a model with an Embedding, as Keras 3 builds it.

    Dense gradients: one packed all-reduce (instance 112), 1-2 on replica 0 and 1.5-2 on
    replica 1. Sparse gradients: the sizes all-gather (113: "adam/CollectiveGatherV2",
    "_1") at 2-2.5 both, then per replica a cond branch gathering values (114) and
    indices (115): replica 0's in "adam/cond/", replica 1's in "adam/cond_1/", each
    numbered CollectiveGatherV2 and CollectiveGatherV2_1. Replica 0 gathers 3-6 (values,
    waits for replica 1 until 4) and 6-7 (indices); replica 1 gathers 4-6 and 6-7.
    Compute: replica 0 0-1, replica 1 0-1.5. The step is 0-10.
    """
    space = builder().step(5, 0.0, 10.0)
    host = space.host()
    host.event("tf_Compute/1", f"{CALL}/sequential/embedding/GatherV2:GatherV2", 0.0, 1.0)
    host.event("tf_Compute/2", f"{CALL}/replica_1/sequential/embedding/GatherV2:GatherV2", 0.0, 1.5)
    collective(host, "c/1", f"{CALL}/adam/CollectiveReduceV2", 1.0, 2.0, 112)
    collective(host, "c/2", f"{CALL}/adam/CollectiveReduceV2_1", 1.5, 2.0, 112)
    gather = "CollectiveGatherV2"
    collective(host, "c/1", f"{CALL}/adam/{gather}", 2.0, 2.5, 113, op=gather)
    collective(host, "c/2", f"{CALL}/adam/{gather}_1", 2.0, 2.5, 113, op=gather)
    # Replica 1's values gather is "cond_1/.../CollectiveGatherV2" and replica 0's
    # indices gather "cond/.../CollectiveGatherV2_1": the suffix is not the replica.
    for scope, values, indices in [("cond/then/_90", (3.0, 6.0), (6.0, 7.0)),
                                   ("cond_1/then/_108", (4.0, 6.0), (6.0, 7.0))]:  # fmt: skip
        branch = scope.split("/")[0]
        name = f"{CALL}/adam/{scope}/adam/{branch}/{gather}"
        collective(host, "c/3", name, *values, 114, op=gather)
        collective(host, "c/3", f"{name}_1", *indices, 115, op=gather)
    return space


def test_sparse_gradients_are_gathered_apart_and_attributed_by_cond_scope(builder):
    # 1 MB of variables, 0.8 MB of them the table; a step gathers 0.1 MB of rows.
    breakdown = analyze(
        embedding_trace(builder),
        allreduce_bytes=1_000_000,
        sparse_bytes=800_000,
        gather_bytes=100_000,
    )
    assert breakdown.attribution is None
    rows = breakdown.replicas.set_index("replica")
    r0, r1 = rows.loc[0], rows.loc[1]
    # Replica 0: all-reduce 1-2 (waits 1-1.5), gathers 2-2.5 and 3-7 (waits 3-4).
    assert r0["allreduce_ms"] == pytest.approx(5.5)
    assert r0["gather_ms"] == pytest.approx(4.5)
    assert r0["sync_wait_ms"] == pytest.approx(1.5)
    assert r0["gather_transfer_ms"] == pytest.approx(3.5)
    # Replica 1: all-reduce 1.5-2, gathers 2-2.5 and 4-7, no waits.
    assert r1["allreduce_ms"] == pytest.approx(4.0)
    assert r1["gather_ms"] == pytest.approx(3.5)
    assert r1["sync_wait_ms"] == 0
    # Bytes: the all-reduce carries the dense 0.2 MB, the gather 0.1 MB.
    assert r0["allreduce_bytes"] == 200_000 and r0["gather_bytes"] == 100_000
    assert r0["row_bytes"] == 300_000
    # Gather busbw = 0.1 MB / 3.5 ms * (2-1)/2.
    assert r0["gather_busbw_gbps"] == pytest.approx(100_000 / 3.5e-3 / 1e9 / 2)


def test_gradient_packs_are_attributed_by_copy_order(builder):
    """Two packs on two replicas: TF creates replica 0's packs first, so copies 0 and
    1 are replica 0's (instances 7 and 8), copies 2 and 3 replica 1's. Modulo the
    replica count would give copy 2 to replica 0."""
    space = builder().step(1, 0.0, 10.0)
    host = space.host()
    collective(host, "c/1", f"{CALL}/adam/CollectiveReduceV2", 1.0, 3.0, 7)  # r0 pack 0
    collective(host, "c/1", f"{CALL}/adam/CollectiveReduceV2_1", 4.0, 5.0, 8)  # r0 pack 1
    collective(host, "c/2", f"{CALL}/adam/CollectiveReduceV2_2", 2.0, 3.0, 7)  # r1 pack 0
    collective(host, "c/2", f"{CALL}/adam/CollectiveReduceV2_3", 4.5, 5.0, 8)  # r1 pack 1
    for copy, (start, end) in enumerate([(0.0, 1.0), (3.0, 4.0), (0.0, 2.0), (3.0, 4.5)]):
        host.event(
            "tf_Compute/1", f"{CALL}/adam/concat_{copy}:ConcatV2".replace("_0:", ":"), start, end
        )
    breakdown = analyze(space)
    rows = breakdown.replicas.set_index("replica")
    assert breakdown.attribution is None
    assert rows.loc[0, "allreduce_ms"] == pytest.approx(3.0)  # 1-3 and 4-5
    assert rows.loc[0, "sync_wait_ms"] == pytest.approx(1.5)  # 1-2 and 4-4.5
    assert rows.loc[1, "allreduce_ms"] == pytest.approx(1.5)
    assert rows.loc[1, "sync_wait_ms"] == 0
    # The packing concats: 0-1 and 3-4 replica 0's, 0-2 and 3-4.5 replica 1's.
    assert rows.loc[0, "compute_ms"] == pytest.approx(2.0)
    assert rows.loc[1, "compute_ms"] == pytest.approx(3.5)


def test_ambiguous_attribution_is_said_not_guessed_silently(builder):
    space = builder().step(1, 0.0, 10.0)
    host = space.host()
    for copy, start in enumerate([1.0, 2.0, 3.0]):  # 3 copies of one collective, 2 replicas
        collective(host, f"c/{copy}", f"{CALL}/adam/CollectiveReduceV2_{copy}", start, 5.0, 9)
    collective(host, "c/9", f"{CALL}/adam/CollectiveReduceV2_7", 1.0, 2.0, 10)
    collective(host, "c/9", f"{CALL}/adam/CollectiveReduceV2_8", 1.0, 2.0, 10)
    breakdown = analyze_xspace(space.space, local_replicas=2)
    assert "a collective had 3 copies for 2 replicas" in breakdown.attribution


def test_reduction_to_one_device_counts_as_communication_of_every_replica(builder):
    """CentralStorageStrategy on CPU devices: the replicas' gradients are summed by a
    top-level AddN on the parameter device (2-3); it holds every replica's update."""
    space = builder().step(1, 0.0, 10.0)
    host = space.host()
    host.event("tf_Compute/1", "sequential/dense/MatMul:_MklMatMul", 0.0, 2.0)
    host.event("tf_Compute/2", "replica_1/sequential/dense/MatMul:_MklMatMul", 0.0, 1.0)
    host.event("tf_Compute/1", "AddN_2:AddN", 2.0, 3.0)
    host.event("tf_Compute/1", "Adam/sub_3:Sub", 3.0, 4.0)
    rows = analyze(space, local_replicas=2, allreduce_bytes=1000).replicas.set_index("replica")
    assert rows["allreduce_ms"].tolist() == pytest.approx([1.0, 1.0])
    assert rows["sync_wait_ms"].tolist() == [0, 0]
    assert rows["allreduce_bytes"].tolist() == [1000, 1000]


def test_other_time_is_split_into_dispatch_idle_and_scheduling(builder):
    """Step 0-10. No op before 2 or after 9 (dispatch: 3 ms). Replica 0 runs 2-4 and
    6-9, replica 1 runs 2-3 and 7-9: nobody runs 4-6 (idle 2 ms). Replica 1 is also
    without work 3-4 and 6-7 while replica 0 runs (scheduling 2 ms)."""
    space = builder().step(1, 0.0, 10.0)
    host = space.host()
    host.event("tf_Compute/1", "a/MatMul:_MklMatMul", 2.0, 4.0)
    host.event("tf_Compute/1", "a/Relu:Relu", 6.0, 9.0)
    host.event("tf_Compute/2", "replica_1/a/MatMul:_MklMatMul", 2.0, 3.0)
    host.event("tf_Compute/2", "replica_1/a/Relu:Relu", 7.0, 9.0)
    rows = analyze(space).replicas.set_index("replica")
    assert rows.loc[0, ["dispatch_ms", "idle_ms", "scheduling_ms"]].tolist() == [3.0, 2.0, 0.0]
    assert rows.loc[1, ["dispatch_ms", "idle_ms", "scheduling_ms"]].tolist() == [3.0, 2.0, 2.0]
