"""Child process of ``compare_strategies``' ``parameter_server`` candidate: the
coordinator of a local ParameterServerStrategy cluster that it starts, its model and
steps.

Started by ``keras_dp_tools.tools.strategies.compare`` (``tools/tuning/child.py`` has the
protocol; ``parameter_server.py`` the options); not meant to be run by hand.

- ready: the servers (``_ps_server``, one process each) are up, the strategy is built
  (the candidate's ``code``, with ``TF_CONFIG`` naming this cluster), the model built in
  its scope, and ``warmup_steps`` steps trained.
- ``{"time": N}``: one ``fit`` of ``2 x workers`` warm-up calls and ``N x workers`` timed
  ones. ``fit`` only schedules each call; a thread waits for their results in order,
  and the clock runs from the moment the warm-up calls have all finished to the moment
  the last call has (so fit's start-up, which builds each worker's iterator, stays out).
  Up to ``workers - 1`` calls may be under way at the start: a small overcount.
- ``{"profile": N}``: worker 0's server is traced (``tf.profiler.experimental.client``)
  for about N + 2 steps while ``fit`` runs; ``analysis.ps_traffic`` reads its steps.
"""

from __future__ import annotations

import os

# Before TensorFlow is imported: tf.keras is tf_keras here (Keras 3's fit does not run
# under ParameterServerStrategy).
os.environ["TF_USE_LEGACY_KERAS"] = "1"

import ctypes
import json
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from keras_dp_tools.capture.run_info import gradient_bytes
from keras_dp_tools.common.text import error_reason
from keras_dp_tools.tools.strategies.parameter_server import (
    SERVER_MODULE,
    SERVER_ROLES,
    code,
    resolve_options,
)
from keras_dp_tools.tools.tuning.child import (
    load_function,
    log_tail,
    require_tf_keras,
    serve,
    strategy_and_model,
    trial_dataset,
)

_PR_SET_PDEATHSIG = 1
_state: dict = {}


def _die_with_parent() -> None:
    """In the server, before it runs: the kernel kills it when the trial dies."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Cluster:
    """The worker and parameter-server processes, on free ports of ``options["hosts"]``;
    ``spec`` is the cluster spec (role -> addresses), the chief's (this process's)
    included. Started from the main thread: the kernel's parent-death signal follows
    the thread that started a process."""

    def __init__(self, options: dict, log_dir: Path):
        from keras_dp_tools.tools.launch import free_ports

        counts = {"chief": 1, "worker": options["workers"], "ps": options["ps"]}
        ports = iter(free_ports(sum(counts.values())))
        hosts = options["hosts"]
        self.spec = {
            role: [f"{hosts[role]}:{next(ports)}" for _ in range(count)]
            for role, count in counts.items()
        }
        self.servers: list[tuple[str, int, subprocess.Popen, Path]] = []
        log_dir.mkdir(parents=True, exist_ok=True)
        try:
            for role in SERVER_ROLES:
                for index in range(counts[role]):
                    self._start(role, index, options["command_prefix"][role], log_dir)
        except BaseException:
            self.close()
            raise

    def _start(self, role: str, index: int, prefix: list[str], log_dir: Path) -> None:
        log_path = log_dir / f"server-{role}-{index}.log"
        with open(log_path, "w", encoding="utf-8") as log:
            command = [*prefix, sys.executable, "-m", SERVER_MODULE, json.dumps(self.spec)]
            process = subprocess.Popen(
                [*command, role, str(index), str(os.getpid())],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )
        self.servers.append((role, index, process, log_path))

    def wait_until_serving(self, timeout: float = 180) -> None:
        """Returns when every server accepts connections; a RuntimeError naming the
        server and its last output when one exits or stays closed for ``timeout``."""
        deadline = time.monotonic() + timeout
        for role, index, process, log_path in self.servers:
            host, port = self.spec[role][index].rsplit(":", 1)
            while True:
                if process.poll() is not None:
                    raise RuntimeError(
                        f"the {role} {index} server exited with status {process.returncode} "
                        f"before serving: {log_tail(log_path, 3)}"
                    )
                try:
                    with socket.create_connection((host, int(port)), timeout=1):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"the {role} {index} server at {host}:{port} did not accept "
                            f"connections within {timeout:.0f} s: {log_tail(log_path, 3)}"
                        ) from None
                    time.sleep(0.2)

    def pids(self) -> list[int]:
        return [process.pid for _, _, process, _ in self.servers]

    def close(self) -> None:
        for _, _, process, _ in self.servers:
            if process.poll() is None:
                process.kill()
        for _, _, process, _ in self.servers:
            process.wait()


def _fit(steps: int, callbacks: list) -> None:
    _state["model"].fit(
        _state["dataset"], steps_per_epoch=steps, epochs=1, verbose=0, callbacks=callbacks
    )


def _set_up(spec: dict) -> dict:
    options = resolve_options(spec.get("options"))
    log_dir = Path(spec["log_dir"])
    cluster = Cluster(options, log_dir)
    _state["cluster"] = cluster
    cluster.wait_until_serving()
    os.environ["TF_CONFIG"] = json.dumps(
        {"cluster": cluster.spec, "task": {"type": "chief", "index": 0}}
    )
    import tensorflow as tf

    strategy, model = strategy_and_model({**spec, "code": spec.get("code") or code(options)})
    require_tf_keras(model, "ParameterServerStrategy")
    # Each worker reads its own copy of the dataset, one batch of per_replica_batch per
    # replica of the worker per step (the workers here have one device).
    worker_batch = spec["per_replica_batch"] * strategy.num_replicas_in_sync
    make_dataset = load_function(spec["dataset"])
    trial_dataset(make_dataset, strategy, worker_batch)  # the contract's errors, here

    def dataset_fn(input_context):
        return trial_dataset(make_dataset, strategy, worker_batch).repeat()

    import tf_keras

    _state.update(
        model=model,
        dataset=tf_keras.utils.experimental.DatasetCreator(dataset_fn),
        workers=options["workers"],
        worker_batch=worker_batch,
        log_dir=log_dir,
        variable_bytes=gradient_bytes(model),
        tf=tf,
    )
    _fit(spec["warmup_steps"] * options["workers"], [])  # tracing, first calls
    return {
        "ready": True,
        "replicas": options["workers"] * strategy.num_replicas_in_sync,
        "strategy": type(strategy).__name__,
        "workers": options["workers"],
        "ps": options["ps"],
        "variable_bytes": _state["variable_bytes"],
        "server_pids": cluster.pids(),
    }


def _completions():
    """A callback that hands each scheduled call's results to a thread, which waits for
    them in order and notes when each has arrived (``done_at``)."""
    import tensorflow as tf
    import tf_keras

    class Completions(tf_keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self._supports_tf_logs = True  # the logs stay remote values: no wait here
            self.pending: queue.Queue = queue.Queue()
            self.done_at: list[float] = []
            self.errors: list[BaseException] = []
            self.thread = threading.Thread(target=self._wait, daemon=True)
            self.thread.start()

        def on_train_batch_end(self, batch, logs=None):
            self.pending.put(logs)

        def on_train_end(self, logs=None):
            self.pending.put(None)
            self.thread.join()

        def _wait(self):
            while (logs := self.pending.get()) is not None:
                try:
                    for value in tf.nest.flatten(logs)[:1]:
                        value.get()
                except Exception as error:  # the fit raises it too; keep the first
                    self.errors.append(error)
                self.done_at.append(time.perf_counter())

    return Completions()


def _time(steps: int) -> dict:
    workers = _state["workers"]
    warm, timed = 2 * workers, steps * workers
    completions = _completions()
    _fit(warm + timed, [completions])
    if completions.errors:
        raise completions.errors[0]
    if len(completions.done_at) != warm + timed:
        raise RuntimeError(f"saw {len(completions.done_at)} calls end of {warm + timed}")
    seconds = completions.done_at[-1] - completions.done_at[warm - 1]
    _state["step_seconds"] = seconds / steps
    return {"steps": steps, "examples": timed * _state["worker_batch"], "seconds": seconds}


def _profile(steps: int) -> dict:
    from keras_dp_tools.analysis.ps_traffic import (
        ps_evidence,
        worker_steps,
        worker_steps_from_trace,
    )
    from keras_dp_tools.analysis.trace.xspace import find_traces

    tf = _state["tf"]
    if "step_seconds" not in _state:
        _time(2)
    duration_ms = max(1000, round(_state["step_seconds"] * (steps + 2) * 1500))
    _state["profiles"] = _state.get("profiles", 0) + 1
    folder = _state["log_dir"] / "ps_profile" / f"capture-{_state['profiles']}"
    worker = _state["cluster"].spec["worker"][0]
    failures: list[BaseException] = []

    def trace():
        try:
            tf.profiler.experimental.client.trace(f"grpc://{worker}", str(folder), duration_ms)
        except Exception as error:  # said in the evidence's note
            failures.append(error)

    tracer = threading.Thread(target=trace, daemon=True)
    tracer.start()
    while tracer.is_alive():  # train until the capture has ended
        _fit((steps + 2) * _state["workers"], [])
    try:
        traces = find_traces(folder)
    except FileNotFoundError:
        traces = []
    if failures or not traces:
        why = error_reason(failures[0]) if failures else "no trace file"
        evidence = ps_evidence(worker_steps([]), _state["variable_bytes"], _state["workers"])
        evidence["note"] = f"worker 0 could not be traced ({why})"
        return {"evidence": evidence}
    table = worker_steps_from_trace(traces[-1])
    evidence = ps_evidence(table, _state["variable_bytes"], _state["workers"])
    evidence["trace"] = str(traces[-1])
    return {"evidence": evidence}


def _command(command: dict) -> dict:
    if "time" in command:
        return _time(int(command["time"]))
    if "profile" in command:
        return _profile(int(command["profile"]))
    raise ValueError(f"unknown command {command!r}: expected time or profile")


def _stop(signum, frame):
    raise SystemExit(128 + signum)


def main() -> None:
    """The trial process: serves the parent's commands (``tuning.child.serve``) until
    told to stop or sent SIGTERM, stopping its cluster on the way out."""
    signal.signal(signal.SIGTERM, _stop)
    status = 0
    try:
        serve(_set_up, _command)
    except SystemExit as exit_:
        status = exit_.code if isinstance(exit_.code, int) else 1
    finally:
        cluster = _state.get("cluster")
        if cluster is not None:
            cluster.close()
        sys.stderr.flush()
    # Not the interpreter's shutdown: TensorFlow's would try to reach the servers just
    # killed (and log an error for each of its remote functions).
    os._exit(status)


if __name__ == "__main__":
    main()
