"""Child process of ``tune_allreduce``: one candidate's strategy, model and steps.

Started by ``keras_dp_tools.tools.tuning.allreduce`` (see ``child.py`` for the protocol); not
meant to be run by hand.
"""

from __future__ import annotations

from keras_dp_tools.tools.tuning.child import (
    load_function,
    serve,
    strategy_and_model,
    trial_dataset,
)

_state: dict = {}


def _fit(steps: int, callbacks: list) -> tuple[int, int]:
    """Fits ``steps`` calls; returns the global steps the call started and ended at."""
    import numpy as np

    model = _state["model"]
    first = int(np.asarray(model.optimizer.iterations))
    model.fit(_state["dataset"], steps_per_epoch=steps, epochs=1, verbose=0, callbacks=callbacks)
    return first, int(np.asarray(model.optimizer.iterations))


def _set_up(spec: dict) -> dict:
    strategy, model = strategy_and_model(spec)
    global_batch = spec.get("per_replica_batch")
    if global_batch:
        global_batch *= strategy.num_replicas_in_sync
    dataset = trial_dataset(load_function(spec["dataset"]), strategy, global_batch)
    _state.update(model=model, dataset=dataset.repeat(), log_dir=spec["log_dir"])
    _fit(spec["warmup_steps"], [])  # tracing and first-step costs stay out of the timing
    return {
        "ready": True,
        "replicas": strategy.num_replicas_in_sync,
        "cross_device_ops": type(strategy.extended._cross_device_ops).__name__,
    }


def _command(command: dict) -> dict:
    from keras_dp_tools.capture.data_parallel_profiler import DataParallelProfiler
    from keras_dp_tools.capture.step_timer import StepTimer

    log_dir = _state["log_dir"]
    timer = StepTimer(log_dir, tensorboard=False)
    if "profile" in command:
        import numpy as np

        start = int(np.asarray(_state["model"].optimizer.iterations)) + 1
        profiler = DataParallelProfiler(
            log_dir, start_step=start, window=command["profile"], tensorboard=False
        )
        # One call before the window (never profiled) and one after it closes.
        first, last = _fit(command["profile"] + 2, [timer, profiler])
    else:
        first, last = _fit(command["time"] + 1, [timer])  # its first call is warm-up
    return {"first_step": first, "last_step": last}


if __name__ == "__main__":
    serve(_set_up, _command)
