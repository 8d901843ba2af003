"""Trials in child processes: how the user's functions reach them, and how parent and
child talk.

TensorFlow's collective state does not reset within a process (a second
``MirroredStrategy`` over the same devices breaks its all-reduces), and a trial that
runs out of memory must not take the caller down, so every trial runs in a fresh
``python -m <module>`` process. Functions cannot be sent to it: they travel as a
reference, ``"package.module:function"`` or ``"/path/to/script.py:function"``, and the
child imports them. A function defined at module level (in an importable module, or
in the script being run) is turned into such a reference automatically; lambdas and
nested functions cannot be, and raise a ValueError saying so.

The child speaks JSON lines on its original stdout; whatever it (TensorFlow, the
user's code) prints goes to stderr, which the parent writes to a log file.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from keras_dp_tools.common.text import error_reason
from keras_dp_tools.records.contract import TRIAL_MARKER, TRIAL_PROCESS_ENV

_PREFIX = "KDT-CHILD "
# make_dataset's first parameter, per spelling (docs/tuning.md: the contract).
BATCH_PARAMETERS = ("global_batch", "batch_size", "batch")
NOT_UNDER_MAIN = (
    "is your training under `if __name__ == '__main__':`? (the trial imports your "
    "script, which runs everything at its top level)"
)


class ContractError(TypeError, ValueError):
    """The user's functions do not follow the tuning contract (docs/tuning.md). A
    ValueError too, so that ``keras-dp`` prints it as a message, not a traceback."""


def refuse_inside_a_trial(what: str) -> None:
    """Raises ContractError when called inside a trial process: the user's script, which
    the trial imports, starts the tuning at import (and would start trials of its own)."""
    if os.environ.get(TRIAL_PROCESS_ENV):
        raise ContractError(
            f"{what} was called inside one of its own trial processes, which import your "
            "script: put this call, and any training, under "
            "`if __name__ == '__main__':`."
        )


def tf_keras_missing(strategy_name: str) -> str | None:
    """Why a candidate under ``strategy_name`` cannot run here when tf_keras is not
    installed (Keras 3's fit does not run under the multi-worker strategies), else None."""
    if importlib.util.find_spec("tf_keras") is None:
        return (
            f"{strategy_name}'s fit needs tf_keras (Keras 3's fit does not run under it: "
            "keras-team/keras#20585): pip install tf-keras"
        )
    return None


def require_tf_keras(model, strategy_name: str) -> None:
    """A TypeError saying what to do when ``model`` is a Keras 3 model, whose ``fit``
    does not run under ``strategy_name`` (the trial sets ``TF_USE_LEGACY_KERAS=1``)."""
    from keras_dp_tools.capture.base import keras_package

    if keras_package(model) != "tf_keras":
        raise TypeError(
            f"build_model returned a Keras 3 model ({type(model).__module__}), whose fit "
            f"does not run under {strategy_name}: build it with tf.keras (this trial sets "
            "TF_USE_LEGACY_KERAS=1, so tf.keras is tf_keras) or import tf_keras as keras."
        )


def dataset_spelling(make_dataset) -> str:
    """``"global_batch"`` for ``make_dataset(global_batch)`` (the contract), or
    ``"strategy"`` for ``make_dataset(strategy)`` / ``make_dataset()`` (accepted: they
    choose their batches), read off the first parameter's name."""
    try:
        parameters = list(inspect.signature(make_dataset).parameters.values())
    except (TypeError, ValueError):
        parameters = None
    positional = [
        p.name for p in parameters or () if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if parameters is not None and not positional:
        return "strategy"
    if positional and positional[0] in BATCH_PARAMETERS:
        return "global_batch"
    if positional and positional[0] == "strategy":
        return "strategy"
    received = "(unreadable signature)" if parameters is None else f"({', '.join(positional)})"
    raise ContractError(
        "make_dataset must be make_dataset(global_batch), returning a tf.data.Dataset of "
        "batches of global_batch examples (or make_dataset(strategy) / make_dataset(), "
        f"returning global batches it chooses); received make_dataset{received}. Name "
        "its first parameter global_batch (or strategy): see keras-dp docs tuning."
    )


NEEDS_A_BATCH = (
    "make_dataset(global_batch) needs a batch size: pass per_replica_batch= to "
    "tune_allreduce (the global batch is per_replica_batch x replicas)."
)


def check_dataset_contract(make_dataset, batch_known: bool = True) -> None:
    """The contract's error before any trial starts, for a function object (a string
    reference is loaded, and checked, in the trial)."""
    if isinstance(make_dataset, str) or not callable(make_dataset):
        return
    if dataset_spelling(make_dataset) == "global_batch" and not batch_known:
        raise ContractError(NEEDS_A_BATCH)


def trial_dataset(make_dataset, strategy, global_batch: int | None = None):
    """The dataset of a trial, by the one contract: ``make_dataset(global_batch)`` when
    a batch is asked for (``find_per_replica_batch``, ``tune_allreduce`` with
    ``per_replica_batch``); ``make_dataset(strategy)`` is accepted, and re-batched to
    ``global_batch`` when one is asked for."""
    spelling = dataset_spelling(make_dataset)
    if spelling == "global_batch" and global_batch is None:
        raise ContractError(NEEDS_A_BATCH)
    import tensorflow as tf

    if spelling == "global_batch":
        dataset = make_dataset(global_batch)
    else:
        dataset = call_flexibly(make_dataset, strategy)
    if not isinstance(dataset, tf.data.Dataset):
        raise ContractError(
            f"make_dataset must return a tf.data.Dataset of global batches, returned "
            f"{type(dataset).__name__}."
        )
    if global_batch is None:
        return dataset
    if spelling == "strategy":
        return dataset.unbatch().batch(global_batch, drop_remainder=True)
    return whole_batches(dataset, global_batch)


def whole_batches(dataset, global_batch: int):
    """``dataset`` (of ``make_dataset(global_batch)``) with every batch of
    ``global_batch`` examples, so that a trial's examples are its steps x the global
    batch: a batch size TensorFlow cannot fix in advance (``.batch(n)`` without
    ``drop_remainder``: the last batch of an epoch may be short) is re-batched with
    ``drop_remainder=True``; a fixed size other than ``global_batch`` is refused."""
    import tensorflow as tf

    sizes = {
        spec.shape[0] if spec.shape.rank else "no batch dimension"
        for spec in tf.nest.flatten(dataset.element_spec)
    }
    if sizes == {global_batch}:
        return dataset
    if sizes <= {global_batch, None}:
        return dataset.unbatch().batch(global_batch, drop_remainder=True)
    received = (
        "unbatched examples"
        if "no batch dimension" in sizes
        else f"batches of {', '.join(sorted(str(size) for size in sizes))} examples"
    )
    raise ContractError(
        f"make_dataset(global_batch) returned {received}, asked for "
        f"global_batch={global_batch}: return dataset.batch(global_batch, "
        "drop_remainder=True), the batch size it is given (every step then trains "
        "global_batch examples, which the measured rates count)."
    )


def strategy_and_model(spec: dict):
    """A trial's strategy, built by ``spec["code"]`` (the very code the result shows the
    user, which assigns ``strategy``), and the compiled model ``spec["build_model"]``
    returns inside its scope."""
    namespace: dict = {}
    exec(spec["code"], namespace)
    strategy = namespace["strategy"]
    with strategy.scope():
        model = call_flexibly(load_function(spec["build_model"]), strategy)
    if not hasattr(model, "fit") or getattr(model, "optimizer", None) is None:
        raise TypeError(
            f"build_model must return a compiled Keras model, returned {type(model).__name__}"
            " (call model.compile(...) before returning it)."
        )
    return strategy, model


def function_reference(function) -> str:
    """``"module:qualname"`` (or ``"script.py:qualname"``) for a module-level function,
    or the given string when it already is one."""
    if isinstance(function, str):
        if ":" not in function:
            raise ValueError(
                f"Expected 'package.module:function' or 'script.py:function', received "
                f"{function!r}."
            )
        return function
    if not callable(function):
        raise TypeError(f"Expected a function, received {function!r}.")
    qualname = getattr(function, "__qualname__", "")
    module_name = getattr(function, "__module__", None)
    if not qualname or "<" in qualname or module_name is None:
        raise ValueError(
            f"{function!r} cannot be re-imported in a child process (a lambda or a nested "
            "function). Define it at module level, or pass 'package.module:function'."
        )
    if module_name == "__main__":
        main_file = getattr(sys.modules["__main__"], "__file__", None)
        if not main_file:
            raise ValueError(
                f"{function.__name__} is defined in an interactive session or notebook, "
                "which a child process cannot import. Put it in a .py file and pass "
                "'file.py:function' or 'module:function'."
            )
        return f"{Path(main_file).resolve()}:{qualname}"
    return f"{module_name}:{qualname}"


def load_function(reference: str):
    """The function a ``function_reference`` names (imports its module or script)."""
    location, _, qualname = reference.rpartition(":")
    if location.endswith(".py"):
        path = Path(location)
        if not path.is_file():
            raise FileNotFoundError(f"No such script: {path} (from {reference!r}).")
        # Another name than __main__: the script's `if __name__ == "__main__":` part,
        # which started the tuning, does not run again here.
        spec = importlib.util.spec_from_file_location("_kdt_user_script", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        sys.path.insert(0, str(path.parent))
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(location)
    value = module
    for part in qualname.split("."):
        value = getattr(value, part)
    return value


def call_flexibly(function, *arguments):
    """Calls ``function`` with as many of ``arguments`` as it takes positionally."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return function(*arguments)
    if any(p.kind is p.VAR_POSITIONAL for p in parameters):
        return function(*arguments)
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return function(*arguments[: len(positional)])


def log_tail(path: Path, lines: int = 5) -> str:
    """The last ``lines`` lines of a process's output file, on one line."""
    text = Path(path).read_text(encoding="utf-8", errors="replace").strip()
    return " | ".join(text.splitlines()[-lines:]) or "(no output)"


class ChildFailed(RuntimeError):
    """The child exited, or reported an error, before answering; ``contract`` is True
    when the error is the user's functions breaking the contract (not worth retrying)."""

    def __init__(self, message: str, contract: bool = False):
        super().__init__(message)
        self.contract = contract


class ChildTimedOut(ChildFailed):
    """The child gave no answer within the time it was given."""


class Child:
    """One trial process: ``python -m module`` given ``spec`` (JSON) as its argument.

    ``request(command)`` sends a JSON line and waits for the child's answer; the first
    answer (the child's "ready") comes from ``wait()``. The child leads a process group
    of its own, so that ``close`` also stops whatever processes it started.
    """

    def __init__(self, module: str, spec: dict, log_path: Path, env: dict | None = None):
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        (self.log_path.parent / TRIAL_MARKER).touch()  # the runs here are a trial's
        self._log = open(self.log_path, "w", encoding="utf-8")  # noqa: SIM115 (closed in close)
        self.process = subprocess.Popen(
            [sys.executable, "-m", module, json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            start_new_session=True,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", TRIAL_PROCESS_ENV: "1", **(env or {})},
        )
        self._answers: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.process.stdout:
            if line.startswith(_PREFIX):
                self._answers.put(json.loads(line[len(_PREFIX) :]))
        self._answers.put(None)  # the child's stdout closed: it exited

    def wait(self, timeout: float | None = None) -> dict:
        """The child's next answer; ChildFailed when it reports an error or exits."""
        try:
            answer = self._answers.get(timeout=timeout)
        except queue.Empty:
            raise ChildTimedOut(f"timed out after {timeout:.0f} s") from None
        if answer is None:
            raise ChildFailed(self.exit_reason(self._exit_code()))
        if answer.get("error"):
            raise ChildFailed(answer["error"], contract=bool(answer.get("contract")))
        return answer

    def send(self, command: dict) -> None:
        """Sends a command without waiting for its answer (``wait`` gets it)."""
        try:
            self.process.stdin.write(json.dumps(command) + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            raise ChildFailed(self.exit_reason(self._exit_code())) from None

    def request(self, command: dict, timeout: float | None = None) -> dict:
        self.send(command)
        return self.wait(timeout)

    def exit_reason(self, code: int) -> str:
        """Why the child exited without answering: the last Python traceback's error
        and where it was raised, else that it exited without a result (TensorFlow's
        last log line says nothing about that)."""
        self._log.flush()
        text = self.log_path.read_text(encoding="utf-8", errors="replace")
        where = f"status {code}; its output: {self.log_path}"
        _, found, traceback_text = text.rpartition("Traceback (most recent call last):")
        if found:
            lines = [line.strip() for line in traceback_text.splitlines() if line.strip()]
            places = [line for line in lines if line.startswith('File "')]
            error = next((line for line in reversed(lines) if not line.startswith("^")), "")
            place = f" ({places[-1]})" if places else ""
            return f"the process raised {error}{place} ({where})"
        return f"the process exited without a result ({where}): {NOT_UNDER_MAIN}"

    def log_tail(self, lines: int = 5) -> str:
        self._log.flush()
        return log_tail(self.log_path, lines)

    def _exit_code(self) -> int:
        """The exit status of a child that is ending: once it exits, what it started is
        killed (its group, before reaping it: a reaped pid may be reused), then it is reaped."""
        self._exited(None)
        self.kill()
        return self.process.wait()

    def _exited(self, timeout: float | None) -> bool:
        """Whether the child exited within ``timeout`` seconds (None: no limit), without
        reaping it (``waitid`` with ``WNOWAIT``)."""
        if self.process.returncode is not None:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                found = os.waitid(os.P_PID, self.process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:  # reaped elsewhere
                return True
            if found is not None:
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def stop(self, timeout: float = 30) -> None:
        """Closes the child's stdin (its cue to end) and gives it ``timeout`` seconds to
        exit; ``kill`` then stops what is left."""
        if self.process.returncode is not None or timeout <= 0:
            return
        with contextlib.suppress(OSError):
            self.process.stdin.close()
        self._exited(timeout)

    def kill(self) -> None:
        """SIGKILL to the child's whole process group (it and what it started), before
        the child is reaped, so that the group id is still the child's."""
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)

    def reap(self) -> None:
        """Waits for the killed child to exit and closes its log."""
        self.process.wait()
        with contextlib.suppress(OSError):
            self.process.stdin.close()
        self._log.close()

    def close(self, timeout: float = 30):
        """Closes the child's stdin (its cue to end), waits ``timeout`` seconds for it to
        exit, then kills its whole process group (it and what it started). The kill runs
        even when the wait is interrupted (a second Ctrl-C)."""
        close_children([self], timeout)


def close_children(children: list[Child], timeout: float = 30) -> None:
    """Ends every child: a ``timeout`` of grace for all together (0: none), then SIGKILL to
    every process group before any is reaped, so that an interrupt during the grace or the
    reaping leaves no process running."""
    try:
        deadline = time.monotonic() + timeout
        for child in children:
            child.stop(max(0.0, deadline - time.monotonic()) if timeout > 0 else 0)
    finally:
        try:
            for child in children:
                child.kill()
        finally:
            for child in children:
                child.reap()


def serve(handle_spec, handle_command=None):
    """The child's side: ``handle_spec(spec) -> answer`` once, then
    ``handle_command(command) -> answer`` for each line from the parent until stdin
    closes. Exceptions become ``{"error": ...}`` answers (and end the child)."""
    protocol = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)  # prints of TensorFlow and of the user's code go to the log, not to us
    sys.stdout = sys.stderr

    def answer(message: dict):
        protocol.write(_PREFIX + json.dumps(message) + "\n")

    try:
        answer(handle_spec(json.loads(sys.argv[1])))
        if handle_command is not None:
            for line in sys.stdin:
                answer(handle_command(json.loads(line)))
    except Exception as error:  # reported to the parent, which says what failed
        import traceback

        traceback.print_exc()
        contract = isinstance(error, ContractError)
        # A contract error is raised again in the parent, whole; any other becomes the
        # candidate's one-line reason.
        reason = f"{type(error).__name__}: {error}" if contract else error_reason(error, 500)
        answer({"error": reason, "contract": contract})
        sys.exit(1)
