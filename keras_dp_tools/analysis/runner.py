"""The analysis runner: the one door from capture into the analysis.

A callback hands a finished profiler window (its trace and ``RunFacts``) or a finished
run (its records) to the runner and gets the result back; it holds no analysis itself.

Run as ``python -m keras_dp_tools.analysis.runner REQUEST ANSWER``, this module is the
child process that analyses a large window (``main``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from keras_dp_tools.records.facts import RunFacts

logger = logging.getLogger("keras_dp_tools")

# -- profiler windows ----------------------------------------------------------------
# The analysis modules load on first use (inside the functions below), so that importing
# the callbacks stays as light as before.

# Where a window is analysed, by measurement (benchmarks/RESULTS.md): in a thread of the
# training process, the analysis holds the GIL while it runs; a child process costs
# about 1 s of CPU in start-up imports. With 0.66 s for a 10 MB window, the thread
# disturbed the next steps less (0.98x against 1.09x); a trace several times larger
# holds the GIL for seconds, so it goes to a child, which imports only the analysis
# (not TensorFlow) and lowers its priority while a thread here waits for it.
CHILD_PROCESS_MIN_BYTES = 32 * 2**20
_THREAD_PREFIX = "keras_dp_analysis"
_CHILD_MODULE = "keras_dp_tools.analysis.runner"  # this module, run by name in the child


class WindowRunner:
    """Analyses finished profiler windows off the training thread, one at a time: in a
    thread of this process, or in a child process for traces of
    ``CHILD_PROCESS_MIN_BYTES`` or more.

    Args:
        thread_initializer: called first in the runner's thread (the profiler lowers
            the thread's priority there).
        child_nice: niceness the child process adds to its own (``os.nice``).
    """

    def __init__(
        self, thread_initializer: Callable[[], None] | None = None, child_nice: int = 0
    ) -> None:
        self.thread_initializer = thread_initializer
        self.child_nice = child_nice
        self._executor: ThreadPoolExecutor | None = None

    def submit(
        self, trace: Path, facts: RunFacts, when_done: Callable[[], None] | None = None
    ) -> Future:
        """Starts the analysis of ``trace``; the future holds its ``Breakdown`` or the
        error it raised. ``when_done`` runs in the runner's thread once the analysis
        ended, before the future is done (so what it records is there by then)."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                1, thread_name_prefix=_THREAD_PREFIX, initializer=self.thread_initializer
            )
        return self._executor.submit(self._analyze, Path(trace), facts, when_done)

    def shutdown(self) -> None:
        """Waits for the analyses submitted and ends the runner's thread (a later
        ``submit`` starts another)."""
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)

    def _analyze(self, trace: Path, facts: RunFacts, when_done):
        try:
            if trace.stat().st_size >= CHILD_PROCESS_MIN_BYTES:
                # A process of its own, which hands freed memory back (release_memory).
                return analyze_in_child(trace, facts, nice=self.child_nice)
            # A thread beside training: the heap it shares is not trimmed (the default).
            from keras_dp_tools.analysis.breakdown.api import analyze_window

            return analyze_window(trace, facts)
        finally:
            if when_done is not None:
                when_done()


def analyze_in_child(trace: Path, facts: RunFacts, nice: int = 0):
    """``analyze_window(trace, facts)`` in a child Python process at ``nice`` (added to
    this process's niceness); raises what it raised, and relays its ``XProfWarning``
    once. Falls back to this process if no child can be started.

    Raises:
        RuntimeError: the child died without an answer (its last lines of stderr say
            why).
    """
    import keras_dp_tools

    root = str(Path(keras_dp_tools.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    with tempfile.TemporaryDirectory(prefix="keras_dp_analysis_") as folder:
        request, answer = Path(folder) / "request.pkl", Path(folder) / "answer.pkl"
        request.write_bytes(pickle.dumps((str(trace), facts, nice)))
        command = [sys.executable, "-m", _CHILD_MODULE, str(request), str(answer)]
        try:
            child = subprocess.run(command, env=env, capture_output=True, text=True)
        except OSError as error:  # no child processes here: analyse in this one
            logger.debug("analysis process could not start (%s); analysing here", error)
            from keras_dp_tools.analysis.breakdown.api import analyze_window

            return analyze_window(trace, facts)
        if not answer.exists():
            last = (child.stderr or "").strip().splitlines()[-3:]
            raise RuntimeError(
                f"the analysis process exited with status {child.returncode}: {' '.join(last)}"
            )
        result, relayed = pickle.loads(answer.read_bytes())
    # The child's stderr is not shown: its XProf warning is raised here, once per process.
    from keras_dp_tools.analysis.breakdown.xprof_steps import relay_warning

    for text in relayed:
        relay_warning(text)
    if isinstance(result, BaseException):
        raise result
    return result


def main(argv: list[str] | None = None) -> None:
    """The child process: reads the request ``(trace, facts, nice)`` pickled at
    ``argv[0]``, analyses the trace with ``release_memory=True`` (the process does
    nothing else) and pickles ``(Breakdown or the error, XProf warnings)`` to
    ``argv[1]``."""
    request, answer = (sys.argv[1:] if argv is None else argv)[:2]
    with open(request, "rb") as file:
        trace, facts, nice = pickle.load(file)
    with contextlib.suppress(AttributeError, OSError):  # no os.nice, or not allowed
        os.nice(nice)
    from keras_dp_tools.analysis.breakdown.api import analyze_window
    from keras_dp_tools.analysis.breakdown.xprof_steps import XProfWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = analyze_window(trace, facts, release_memory=True)
        except Exception as error:
            try:
                pickle.dumps(error)
            except Exception:
                error = RuntimeError(f"{type(error).__name__}: {error}")
            result = error
    relayed = [str(w.message) for w in caught if issubclass(w.category, XProfWarning)]
    with open(answer, "wb") as file:
        pickle.dump((result, relayed), file)


# -- end of profiler windows ---------------------------------------------------------


# -- a finished run: the advice for RunAdvisor ------------------------------------


def run_advice_markdown(files: Iterable[tuple[str | os.PathLike, int]], run_id: str) -> str:
    """The advisor's findings for run ``run_id`` as a markdown list (TensorBoard's Text
    tab): the records ``files``, each read from a byte offset (``Recorder.run_offset``:
    this run's lines, not the runs before it), through the analyzers of ``Report``
    (``Report.from_files(files).for_run(run_id).advice()``)."""
    from keras_dp_tools.analysis.advice import AdvisorFrames, advice_markdown
    from keras_dp_tools.analysis.frames import load_frames
    from keras_dp_tools.analysis.summary import run_advice

    frames = AdvisorFrames.of_mapping(load_frames(files)).for_run(run_id)
    return advice_markdown(run_advice(frames))


if __name__ == "__main__":
    main()
