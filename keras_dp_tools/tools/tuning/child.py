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

import importlib
import importlib.util
import inspect
import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

_PREFIX = "KDT-CHILD "


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


class ChildFailed(RuntimeError):
    """The child exited, or reported an error, before answering."""


class Child:
    """One trial process: ``python -m module`` given ``spec`` (JSON) as its argument.

    ``request(command)`` sends a JSON line and waits for the child's answer; the first
    answer (the child's "ready") comes from ``wait()``.
    """

    def __init__(self, module: str, spec: dict, log_path: Path, env: dict | None = None):
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "w", encoding="utf-8")  # noqa: SIM115 (closed in close)
        self.process = subprocess.Popen(
            [sys.executable, "-m", module, json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})},
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
            raise ChildFailed(f"no answer within {timeout:.0f} s") from None
        if answer is None:
            code = self.process.wait()
            raise ChildFailed(f"the process exited with status {code}: {self.log_tail()}")
        if answer.get("error"):
            raise ChildFailed(answer["error"])
        return answer

    def request(self, command: dict, timeout: float | None = None) -> dict:
        try:
            self.process.stdin.write(json.dumps(command) + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            code = self.process.wait()
            raise ChildFailed(f"the process exited with status {code}: {self.log_tail()}") from None
        return self.wait(timeout)

    def log_tail(self, lines: int = 5) -> str:
        self._log.flush()
        text = self.log_path.read_text(encoding="utf-8", errors="replace").strip()
        return " | ".join(text.splitlines()[-lines:]) or "(no output)"

    def close(self, timeout: float = 30):
        if self.process.poll() is None:
            try:
                self.process.stdin.close()
                self.process.wait(timeout=timeout)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()
        self._log.close()


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
        answer({"error": f"{type(error).__name__}: {error}"})
        sys.exit(1)
