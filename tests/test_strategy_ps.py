"""The parameter-server candidate of ``compare_strategies``: its trial run directly as
a ``Child`` on a local cluster (slow: real TensorFlow servers), its options, and the
reading of a worker's trace (``analysis.ps_traffic``)."""

import ast
import os
import signal
import time
from pathlib import Path

import pytest

from keras_dp_tools.analysis.ps_traffic import ps_evidence, worker_steps
from keras_dp_tools.analysis.trace.xspace import host_planes, plane_events
from keras_dp_tools.tools.strategies import parameter_server
from keras_dp_tools.tools.tuning.child import Child, ChildFailed
from tests.helpers.xplane_builder import MS, SpaceBuilder

SCRIPT = Path(__file__).resolve()
FEATURES, HIDDEN = 64, 32
# The model below, by hand: kernel 64 x 32 + bias 32, kernel 32 x 1 + bias 1, float32.
VARIABLES = 4
VARIABLE_BYTES = (FEATURES * HIDDEN + HIDDEN + HIDDEN * 1 + 1) * 4


def build_model():
    import tensorflow as tf

    keras = tf.keras  # tf_keras in the trial (TF_USE_LEGACY_KERAS=1)
    model = keras.Sequential(
        [keras.Input((FEATURES,)), keras.layers.Dense(HIDDEN), keras.layers.Dense(1)]
    )
    model.compile(optimizer=keras.optimizers.SGD(1e-3), loss="mse")
    return model


def make_dataset(global_batch):
    import numpy as np
    import tensorflow as tf

    x = np.random.default_rng(0).normal(size=(global_batch, FEATURES)).astype("float32")
    return tf.data.Dataset.from_tensors((x, x[:, :1]))


def broken_model():
    raise ValueError("no model today")


def _server_pids(trial_pid: int) -> list[int]:
    """Live processes serving for the trial ``trial_pid`` (its pid ends their command
    line), from /proc: what the trial itself says does not count."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        argv = [part.decode(errors="replace") for part in argv if part]
        if parameter_server.SERVER_MODULE in argv and argv[-1] == str(trial_pid):
            found.append(int(entry.name))
    return found


def _child(tmp_path, build="build_model", **options) -> Child:
    spec = {
        "build_model": f"{SCRIPT}:{build}",
        "dataset": f"{SCRIPT}:make_dataset",
        "per_replica_batch": 8,
        "warmup_steps": 2,
        "log_dir": str(tmp_path / "ps"),
        "options": options,
        "code": parameter_server.code(options),
    }
    return Child(parameter_server.CHILD_MODULE, spec, tmp_path / "ps" / "output.log")


def _gone_within(trial_pid: int, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while (alive := _server_pids(trial_pid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive


# -- options ------------------------------------------------------------------------------


def test_options_fill_in_defaults_and_refuse_what_they_cannot_use():
    resolved = parameter_server.resolve_options({"workers": 3})
    assert (resolved["workers"], resolved["ps"]) == (3, 1)
    assert resolved["hosts"] == dict.fromkeys(("chief", "worker", "ps"), "localhost")
    assert resolved["command_prefix"] == {"worker": [], "ps": []}
    assert parameter_server.replicas({"workers": 3}) == 3
    assert parameter_server.replicas({}) == parameter_server.DEFAULT_OPTIONS["workers"]
    for bad, said in [
        ({"workers": 0}, "'workers' must be a positive integer, received 0"),
        ({"ps": True}, "'ps' must be a positive integer"),
        ({"gpus": 2}, "Unknown parameter_server option(s) ['gpus']"),
        ({"hosts": {"evaluator": "x"}}, "'hosts' maps roles"),
        ({"command_prefix": {"ps": "ip netns exec x"}}, "must be a list of strings"),
    ]:
        with pytest.raises(ValueError) as error:
            parameter_server.skip_reason(bad)
        assert said in str(error.value)


def test_the_code_is_python_that_builds_the_strategy_from_tf_config():
    text = parameter_server.code({"workers": 3, "ps": 2})
    ast.parse(text)
    assert "tf.distribute.ParameterServerStrategy(" in text
    assert "TFConfigClusterResolver()" in text
    assert "3 'worker' and 2 'ps'" in text
    assert parameter_server.skip_reason({}) is None  # tf_keras is installed here


def test_a_keras_3_model_is_refused_with_the_way_to_a_tf_keras_one(tf):
    import keras

    from keras_dp_tools.tools.tuning.child import require_tf_keras

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    with pytest.raises(TypeError, match="does not run under ParameterServerStrategy") as error:
        require_tf_keras(model, "ParameterServerStrategy")
    assert "import tf_keras as keras" in str(error.value)
    import tf_keras

    require_tf_keras(tf_keras.Sequential([tf_keras.layers.Dense(1)]), "ParameterServerStrategy")


# -- the worker's trace -----------------------------------------------------------------

WORKER = "/job:worker/replica:0/task:0/device:CPU:0"
PS = "/job:ps/replica:0/task:0/device:CPU:0"


def _send(host, line, name, start, end, to_device):
    key = f"{WORKER};da5976fcbe6705bd;{to_device};edge_1_{name};0:0"
    host.event(line, f"{name}:_Send", start, end, key=key)


def _async_recv(host, line, which, at_ms, kernel_name, **stats):
    """A ``_Recv`` kernel's ``ExecutorState::ProcessAsync::<which>`` event of 0.05 ms
    ending at ``at_ms`` (or starting, for ``Start``). Its ``name`` stat is set by hand:
    the builder's own ``name`` parameter is the event's name."""
    start = at_ms if which == "Start" else at_ms - 0.05
    event = host.event_ps(
        line,
        f"ExecutorState::ProcessAsync::{which}",
        round(start * MS),
        round(0.05 * MS),
        kernel_type="_Recv",
        **stats,
    )
    event.stats.add(metadata_id=host.stat_id("name")).str_value = kernel_name


def _read(host, start, end, name, producer):
    """A variable read pending from ``start`` to ``end``, as TF 2.21 records one."""
    _async_recv(host, "tf_Compute/1", "Start", start, name, step_id=7, _p=producer, _pt=2)
    _async_recv(host, "tf_GrpcWorkerEnvQueues/3", "Done", end, name, step_id=7, _c=producer, _ct=2)


def _worker_trace():
    """A worker's trace with the event names and stats TF 2.21 wrote on a real run of
    ``_ps_trial`` (``tf.profiler.experimental.client.trace`` of worker 0's server; see
    ``analysis/ps_traffic.py``), built by hand so that every number below is known."""
    space = SpaceBuilder()
    host = space.host()
    step = "EagerLocalExecute: __inference_train_function_681"
    for offset in (0.0, 13.0):  # two steps of 10 ms, 3 ms apart
        host.event("tf_Compute/2", step, offset, offset + 10)
        host.event("tf_Compute/2", "KernelAndDeviceFunc::Run", offset + 0.01, offset + 9.99)
        base = int(offset * 100)
        _read(host, offset + 0.5, offset + 3.0, "dense/MatMul/ReadVariableOp/_2", base + 1)
        _read(host, offset + 4.0, offset + 4.5, "dense/BiasAdd/ReadVariableOp/_4", base + 2)
        _read(host, offset + 7.0, offset + 8.0, "div_no_nan/ReadVariableOp/_14", base + 3)
        # The function's argument, received locally: not a read from a parameter server.
        argument = "_recv_Placeholder/_0_0"
        _async_recv(host, "tf_Compute/1", "Start", offset + 0.2, argument, step_id=-1, _p=base + 9)
        host.event("tf_Compute/1", "ExecutorState::Process", offset + 3.0, offset + 6.0, id=7)
        forward, backward = "dense/BiasAdd:_MklNativeFusedMatMul", "gradient/MatMul:_MklMatMul"
        host.event("tf_Compute/1", forward, offset + 3.0, offset + 5.0)
        host.event("tf_Compute/1", backward, offset + 5.5, offset + 6.0)
        _send(host, "tf_Compute/1", "gradient_tape/dense/MatMul", offset + 6.0, offset + 6.1, PS)
        # A send between devices of the worker: not a push.
        _send(host, "tf_Compute/1", "Sink", offset + 6.05, offset + 6.2, WORKER)
    # Before the first step: the iterator's set-up, in no step.
    host.event("tf_Compute/1", "MakeIterator:MakeIterator", -5.0, -1.0)
    return space.space


def test_a_workers_steps_reads_pushes_and_waits_from_its_trace():
    events = [e for plane in host_planes(_worker_trace()) for e in plane_events(plane)]
    steps = worker_steps(events)
    assert len(steps) == 2
    first = steps.iloc[0]
    # By hand: compute 3-5 and 5.5-6 = 2.5 ms. The worker's own work ends with its
    # local send at 6.2 (after the push, 6.0-6.1). Before that, reads pending 0.5-3
    # and 4-4.5 (under compute): 2.5 ms of read wait. Then it waits 10 - 6.2 = 3.8 ms
    # for the parameter server (the read at 7-8, a metric's value, inside it): 6.3 ms.
    assert first["step_ms"] == pytest.approx(10.0)
    assert first["compute_ms"] == pytest.approx(2.5)
    assert first["read_wait_ms"] == pytest.approx(2.5)
    assert first["push_wait_ms"] == pytest.approx(3.8)
    assert first["comm_ms"] == pytest.approx(6.3)
    assert (first["reads"], first["pushes"]) == (3, 1)
    evidence = ps_evidence(steps, variable_bytes=1000, workers=2)
    assert evidence["dispatch_gap_ms"] == pytest.approx(3.0)
    assert evidence["comm_ms"] == pytest.approx(6.3)
    # Per step (a batch on each of 2 workers): 2 x 1000 bytes read, 2 x 1000 pushed.
    assert (evidence["read_bytes"], evidence["push_bytes"]) == (2000, 2000)
    assert evidence["bytes_per_step"] == 4000
    assert evidence["bytes_source"] == "model sizes"
    assert evidence["trace_steps"] == 2


def test_no_traced_step_gives_the_bytes_and_says_why_the_times_are_missing():
    evidence = ps_evidence(worker_steps([]), variable_bytes=10, workers=3)
    assert evidence["bytes_per_step"] == 60
    assert "comm_ms" not in evidence and "step_ms" not in evidence
    assert "no complete training step" in evidence["note"]


# -- the trial, for real ----------------------------------------------------------------


@pytest.mark.slow
def test_the_trial_trains_on_a_local_cluster_and_answers_with_checked_numbers(tmp_path):
    child = _child(tmp_path, workers=2, ps=1)
    try:
        ready = child.wait(timeout=300)
        assert ready["ready"] and ready["replicas"] == 2
        assert ready["strategy"].startswith("ParameterServerStrategy")
        assert ready["variable_bytes"] == VARIABLE_BYTES
        # Three servers (2 workers, 1 parameter server), seen in /proc.
        assert sorted(_server_pids(child.process.pid)) == sorted(ready["server_pids"])
        assert len(ready["server_pids"]) == 3
        started = time.perf_counter()
        timed = child.request({"time": 10}, timeout=300)
        wall = time.perf_counter() - started
        # 10 steps = a batch of 8 on each of 2 workers, 10 times.
        assert (timed["steps"], timed["examples"]) == (10, 10 * 2 * 8)
        assert 0 < timed["seconds"] < wall
        evidence = child.request({"profile": 3}, timeout=300)["evidence"]
    finally:
        child.close()
    # Every step reads each of the 4 trainable variables from the parameter server
    # and pushes 4 gradients to it (plus the loss metric's few scalars).
    assert evidence["reads_per_worker_step"] >= VARIABLES
    assert evidence["pushes_per_worker_step"] >= VARIABLES
    assert evidence["bytes_source"] == "model sizes"
    assert evidence["bytes_per_step"] == 2 * 2 * VARIABLE_BYTES
    assert evidence["trace_steps"] >= 3
    assert 0 < evidence["compute_ms"] < evidence["step_ms"]
    assert 0 < evidence["comm_ms"] <= evidence["step_ms"]
    assert Path(evidence["trace"]).is_file()
    assert _server_pids(child.process.pid) == []  # closing the trial ended its servers


@pytest.mark.slow
def test_a_failing_build_model_is_named_and_leaves_no_server_behind(tmp_path):
    child = _child(tmp_path, build="broken_model")
    try:
        with pytest.raises(ChildFailed, match="ValueError: no model today"):
            child.wait(timeout=300)
    finally:
        child.close()
    assert _gone_within(child.process.pid, 10) == []


@pytest.mark.slow
def test_killing_the_trial_kills_its_servers(tmp_path):
    child = _child(tmp_path, workers=1)
    try:
        ready = child.wait(timeout=300)
        assert len(_server_pids(child.process.pid)) == 2
        os.kill(child.process.pid, signal.SIGKILL)  # no clean-up of its own can run
        child.process.wait()
        assert _gone_within(child.process.pid, 10) == [], ready["server_pids"]
    finally:
        child.close()
