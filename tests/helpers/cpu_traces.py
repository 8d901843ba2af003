"""A made-up CPU-device trace, as TensorFlow names the ops of two replicas on logical CPU
devices, with its expected breakdown worked out by hand in the docstring."""


def cpu_trace(builder):
    """Two replicas on CPU logical devices, as TF names their ops; step 0-8 ms.

    Replica 0 (no scope): forward 0-2, concat 2-2.5, collective 2.5-5 (key 100).
    Replica 1: forward 0.5-3.5 (replica_1/), concat_1 3.5-4, collective_1 4-5 (key 100),
    update_1_3 (its 4th variable's update) 5-6.
    """
    space = builder().step(42, 0.0, 8.0)
    host = space.host()
    call = "StatefulPartitionedCall"
    host.event("tf_Compute/1", f"{call}/sequential/dense/MatMul:_MklMatMul", 0.0, 2.0)
    host.event("tf_Compute/2", f"{call}/replica_1/sequential/dense/MatMul:_MklMatMul", 0.5, 3.5)
    host.event("tf_Compute/1", f"{call}/adam/concat:ConcatV2", 2.0, 2.5)
    host.event("tf_Compute/2", f"{call}/adam/concat_1:ConcatV2", 3.5, 4.0)
    host.event(
        "collective_ops/7",
        f"{call}/adam/CollectiveReduceV2:CollectiveReduceV2",
        2.5,
        5.0,
        instance_key=100,
        group_key=1,
    )
    host.event(
        "collective_ops/8",
        f"{call}/adam/CollectiveReduceV2_1:CollectiveReduceV2",
        4.0,
        5.0,
        instance_key=100,
        group_key=1,
    )
    host.event("tf_Compute/2", f"{call}/adam/update_1_3/Sub:Sub", 5.0, 6.0)
    host.event("tf_Compute/1", "ExecutorState::Process", 0.0, 7.0)  # bookkeeping: ignored
    host.event("python", "EagerLocalExecute: __inference_train_step_1", 0.0, 7.5)
    return space
