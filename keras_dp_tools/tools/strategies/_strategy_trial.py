"""Child process of ``compare_strategies``: one synchronous candidate (one_device,
mirrored, central_storage, or one worker of multi_worker_mirrored), its model and steps.

Started by ``keras_dp_tools.tools.strategies.compare`` (``child.py`` has the protocol);
not meant to be run by hand. Every worker of a multi-worker candidate gets every
command (their steps are collective); the parent reads worker 0's answer.

``{"time": N}`` is timed between step ends: fit runs N + 1 steps and the clock starts
when the first of them ends, so fit's start-up (building the iterator, the first call)
stays out of the N steps' wall time.
"""

from __future__ import annotations

import time

from keras_dp_tools.capture.run_info import (
    global_step,
    gradient_bytes,
    keras_package,
    steps_per_execution,
    worker_index,
)
from keras_dp_tools.tools.tuning.child import (
    ContractError,
    load_function,
    require_tf_keras,
    serve,
    strategy_and_model,
    trial_dataset,
)

_state: dict = {}


def _fit(steps: int, callbacks: list) -> None:
    _state["model"].fit(
        _state["dataset"], steps_per_epoch=steps, epochs=1, verbose=0, callbacks=callbacks
    )


def refuse_steps_per_execution(model) -> None:
    """A ContractError for a model compiled with ``steps_per_execution`` > 1: Keras then
    calls the step hooks once per execution, and the rounds are timed between step ends."""
    steps = steps_per_execution(model)
    if steps > 1:
        raise ContractError(
            f"build_model compiled the model with steps_per_execution={steps}: the "
            "comparison times each step between step ends, which Keras reports once per "
            f"{steps} steps then. Call compile() without it in the build_model you compare "
            "(steps_per_execution=1)."
        )


def _set_up(spec: dict) -> dict:
    strategy, model = strategy_and_model(spec)
    refuse_steps_per_execution(model)
    if spec["candidate"] == "multi_worker_mirrored":
        require_tf_keras(model, "MultiWorkerMirroredStrategy (keras-team/keras#20585)")
    global_batch = spec["per_replica_batch"] * strategy.num_replicas_in_sync
    dataset = trial_dataset(load_function(spec["dataset"]), strategy, global_batch)
    _state.update(
        model=model,
        dataset=dataset.repeat(),
        log_dir=spec["log_dir"],
        global_batch=global_batch,
        candidate=spec["candidate"],
        worker=worker_index(strategy)[0],
    )
    _fit(spec["warmup_steps"], [])  # tracing and first-step costs stay out of the timing
    return {
        "ready": True,
        "replicas": strategy.num_replicas_in_sync,
        "strategy": type(strategy).__name__,
        "keras": keras_package(model),
        # What a step reads and pushes back as gradients where the variables live apart
        # from the replicas (central storage).
        "variable_bytes": gradient_bytes(model),
        "variable_device": _variable_device(model),
        "replica_devices": list(strategy.extended.worker_devices),
    }


def _variable_device(model) -> str | None:
    """Where the first trainable variable lives (Keras 3 wraps a tf.Variable)."""
    variable = model.trainable_variables[0] if model.trainable_variables else None
    for candidate in (variable, getattr(variable, "value", None)):
        device = getattr(candidate, "device", None)
        if isinstance(device, str) and device:
            return device
    return None


def _clock():
    from keras_dp_tools.capture.base import DataParallelCallback

    class StepEnds(DataParallelCallback):
        def __init__(self):
            super().__init__()
            self.ends: list[float] = []

        def on_train_batch_end(self, batch, logs=None):
            self.ends.append(time.perf_counter())

    return StepEnds()


def _time(steps: int) -> dict:
    clock = _clock()
    _fit(steps + 1, [clock])
    if len(clock.ends) != steps + 1:
        raise RuntimeError(f"timed {len(clock.ends)} step ends of {steps + 1}")
    return {
        "steps": steps,
        "examples": steps * _state["global_batch"],
        "seconds": clock.ends[-1] - clock.ends[0],
    }


def _profile(steps: int) -> dict:
    from keras_dp_tools.capture.data_parallel_profiler import DataParallelProfiler
    from keras_dp_tools.capture.step_timer import StepTimer

    log_dir = _state["log_dir"]
    timer = StepTimer(log_dir, global_batch=_state["global_batch"], tensorboard=False)
    profiler = DataParallelProfiler(
        log_dir, start_step=(global_step(_state["model"]) or 0) + 1, window=steps, tensorboard=False
    )
    # One call before the window (never profiled) and one after it closes.
    _fit(steps + 2, [timer, profiler])
    if _state["worker"] != 0:  # only the chief profiles (DataParallelProfiler's default)
        return {"evidence": {}}
    return {"evidence": _evidence(log_dir)}


def _evidence(log_dir) -> dict:
    """The profiled steps' breakdown, by our own analysis of the window (medians)."""
    from keras_dp_tools.report.facade import Report

    report = Report.load(log_dir, trials=True)
    windows = report.windows
    steps = report.steps.dropna(subset=["exposed_allreduce_ms"])
    if "worker" in steps.columns:
        steps = steps[steps["worker"] == 0]
    if steps.empty:
        statuses = windows[["status", "reason"]].to_dict("records") if len(windows) else []
        return {"note": f"no analysed profiled step (windows: {statuses})"}
    evidence = {
        "step_ms": float(steps["step_ms"].median()),
        "comm_ms": float(steps["exposed_allreduce_ms"].median()),
        "allreduce_ms": float(steps["allreduce_ms"].median()),
        "exposed_transfer_ms": float(steps["exposed_transfer_ms"].median()),
        "exposed_sync_wait_ms": float(steps["exposed_sync_wait_ms"].median()),
        "compute_ms": float(steps["compute_ms"].median()),
    }
    allreduce_bytes = steps["allreduce_bytes"].dropna()
    if len(allreduce_bytes) and allreduce_bytes.median() > 0:
        # The breakdown's bytes are the trainable variables' (collective events carry
        # no shapes): docs/breakdown.md.
        evidence.update(bytes_per_step=float(allreduce_bytes.median()), bytes_source="model sizes")
    if _state["candidate"] == "central_storage":
        # Seen in its traces: the replicas' variable reads are _Send copies (which the
        # breakdown counts), but the gradient sum on the variables' device runs as
        # grappler's "ArithmeticOptimizer/AddOpsRewrite_AddN", which it counts as compute.
        evidence["copy_ms"] = evidence.pop("comm_ms")
        evidence.pop("bytes_per_step", None)
        evidence.pop("bytes_source", None)
        evidence["note"] = CENTRAL_STORAGE_NOTE
    return evidence


CENTRAL_STORAGE_NOTE = (
    "our breakdown sees the replicas' variable copies (copy_ms) but counts the gradient "
    "sum on the variables' device (grappler's AddOpsRewrite_AddN) as compute, so its "
    "communication time is not measured"
)


def _command(command: dict) -> dict:
    if "profile" in command:
        return _profile(int(command["profile"]))
    return _time(int(command["time"]))


if __name__ == "__main__":
    serve(_set_up, _command)
