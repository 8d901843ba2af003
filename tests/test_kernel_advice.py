"""The slower-kernels finding on two runs at one per-replica batch whose traces are built
here (the profiler's XPlane schema), so the compute per example and the op-type mix are
known by construction: worked out in the comments, not read from the analyzer."""

import pytest

import keras_dp_tools as kdt
from keras_dp_tools.analysis.kernel_advice import kernel_findings, mix_change, op_type_ms
from tests.helpers.recorded_runs import BALANCED, write_run
from tests.helpers.xplane_builder import SpaceBuilder

PER_REPLICA = 16
PROFILED = range(10, 15)  # write_run's window: 5 steps
TRACE = "train/plugins/profile/x/h.xplane.pb"  # where write_run's window points


def write_profiled_run(log_dir, replicas: int, ops_per_step: dict[str, float], start: float):
    """A run of ``replicas`` at PER_REPLICA examples each, its window's trace holding,
    on every replica and profiled step, one op of each type for the given ms."""
    write_run(
        log_dir,
        run=f"r{replicas}-{start:.0f}",
        replicas=replicas,
        global_batch=PER_REPLICA * replicas,
        breakdown=BALANCED,
        profiled=PROFILED,
        start=start,
    )
    space = SpaceBuilder()
    host = space.host()
    at = 0.0
    for step in PROFILED:
        step_start = at
        for replica in range(replicas):
            scope = "" if replica == 0 else f"replica_{replica}/"
            for op_type, ms in ops_per_step.items():
                host.event(
                    f"tf_Compute{replica}", f"{scope}model/{op_type.lower()}:{op_type}", at, at + ms
                )
                at += ms
        space.step(step, step_start, at)
    space.save(log_dir / TRACE)


ONE = {"MatMul": 2.0, "Tanh": 1.0, "Add": 1.0}  # 4 ms per replica-step: 250 µs per example


def test_op_type_ms_sums_the_compute_ops_of_every_replica(tmp_path):
    write_profiled_run(tmp_path, 4, ONE, start=1000.0)

    times = op_type_ms(tmp_path / TRACE)

    # 5 steps x 4 replicas x 2 ms of MatMul.
    assert times.to_dict() == pytest.approx({"MatMul": 40.0, "Tanh": 20.0, "Add": 20.0})


def test_a_kernel_change_fires_with_the_op_types_that_grew(tmp_path):
    write_profiled_run(tmp_path / "one", 1, ONE, start=1000.0)
    # Under the strategy the layer runs a generic loop: MatMul slower and two op types
    # the one-replica run never ran. Per example: (3 + 1 + 1 + 1.5 + 1.5) / 16 = 500 µs,
    # 2.00x the 250 µs; shares move by 0.5 * (.125 + .125 + .125 + .1875 + .1875) = 37.5%.
    cell = {"MatMul": 3.0, "Tanh": 1.0, "Add": 1.0, "TensorListGetItem": 1.5, "Select": 1.5}
    write_profiled_run(tmp_path / "four", 4, cell, start=2000.0)

    (finding,) = kernel_findings(kdt.Report.load(tmp_path).frames)

    assert finding.code == "slower-kernels" and finding.severity == "warning"
    assert "rose 2.00x from 1 to 4 replicas (250 to 500 µs)" in finding.evidence
    assert "moved by 38%" in finding.evidence  # 37.5%
    # +93.75 µs each for the new op types, +62.5 µs for MatMul.
    assert "Select +94 µs per example, TensorListGetItem +94 µs per example, MatMul +62" in (
        finding.evidence
    )
    assert "not run at 1 replica(s): Select, TensorListGetItem" in finding.evidence
    assert any(item.code == "slower-kernels" for item in kdt.Report.load(tmp_path).advice())


def test_near_miss_contention_slows_every_op_type_alike(tmp_path):
    write_profiled_run(tmp_path / "one", 1, ONE, start=1000.0)
    # Replicas sharing cores: every op 1.5x slower, 375 µs per example, same mix.
    write_profiled_run(tmp_path / "four", 4, {op: ms * 1.5 for op, ms in ONE.items()}, 2000.0)

    assert kernel_findings(kdt.Report.load(tmp_path).frames) == []


def test_near_miss_another_per_replica_batch_is_not_compared(tmp_path):
    write_profiled_run(tmp_path / "one", 1, ONE, start=1000.0)
    cell = {"MatMul": 3.0, "TensorListGetItem": 3.0}
    write_profiled_run(tmp_path / "four", 4, cell, start=2000.0)
    frames = kdt.Report.load(tmp_path).frames
    runs = frames.runs.copy()
    runs.loc[runs["replicas"] == 4, "global_batch"] = 128  # 32 per replica, not 16
    frames.runs = runs

    assert kernel_findings(frames) == []


def test_a_trace_gone_says_nothing(tmp_path):
    write_profiled_run(tmp_path / "one", 1, ONE, start=1000.0)
    write_profiled_run(tmp_path / "four", 4, {"MatMul": 3.0, "Select": 3.0}, start=2000.0)
    (tmp_path / "four" / TRACE).unlink()

    assert kernel_findings(kdt.Report.load(tmp_path).frames) == []


def test_mix_change_is_half_the_sum_of_the_share_differences():
    import pandas as pd

    before = pd.Series({"MatMul": 2.0, "Add": 2.0})  # 50% / 50%
    after = pd.Series({"MatMul": 1.0, "Add": 1.0, "Select": 2.0})  # 25% / 25% / 50%

    assert mix_change(before, after) == pytest.approx(0.5)
