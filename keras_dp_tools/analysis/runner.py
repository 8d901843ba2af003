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
from dataclasses import dataclass
from pathlib import Path

from keras_dp_tools.common.cores import usable_cores
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


def analyze_in_child(trace: Path, facts: RunFacts, nice: int = 0, xprof: bool | None = None):
    """``analyze_window(trace, facts, xprof=xprof)`` in a child Python process at
    ``nice`` (added to this process's niceness); raises what it raised, and relays its
    ``XProfWarning`` once. Falls back to this process if no child can be started.

    Raises:
        RuntimeError: the child died without an answer (its last lines of stderr say
            why).
    """
    env = _child_env()
    with tempfile.TemporaryDirectory(prefix="keras_dp_analysis_") as folder:
        request, answer = Path(folder) / "request.pkl", Path(folder) / "answer.pkl"
        request.write_bytes(pickle.dumps((str(trace), facts, nice, xprof)))
        command = [*_child_command(), str(request), str(answer)]
        try:
            child = subprocess.run(command, env=env, capture_output=True, text=True)
        except OSError as error:  # no child processes here: analyse in this one
            logger.debug("analysis process could not start (%s); analysing here", error)
            from keras_dp_tools.analysis.breakdown.api import analyze_window

            return analyze_window(trace, facts, xprof=xprof)
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
    """The child process: reads the request ``(trace, facts, nice[, xprof])`` pickled at
    ``argv[0]``, analyses the trace with ``release_memory=True`` (the process does
    nothing else) and pickles ``(Breakdown or the error, XProf warnings)`` to
    ``argv[1]``. With ``--queue FOLDER``: one of ``analyze_windows``' processes."""
    request, answer = (sys.argv[1:] if argv is None else argv)[:2]
    if request == "--queue":  # a process of analyze_windows
        _serve_queue(Path(answer))
        return
    with open(request, "rb") as file:
        trace, facts, nice, *xprof = pickle.load(file)  # xprof: optional (None)
    with contextlib.suppress(AttributeError, OSError):  # no os.nice, or not allowed
        os.nice(nice)
    answered = _analyze_here(trace, facts, *xprof)
    with open(answer, "wb") as file:
        pickle.dump(answered, file)


def _analyze_here(trace, facts: RunFacts, xprof: bool | None = None):
    """(``analyze_window``'s ``Breakdown`` or the error it raised, made picklable; the
    XProf warnings it gave) for a process that does nothing else (``release_memory``):
    the child's answer, and a pool worker's (``analyze_windows``)."""
    from keras_dp_tools.analysis.breakdown.api import analyze_window
    from keras_dp_tools.analysis.breakdown.xprof_steps import XProfWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = analyze_window(trace, facts, xprof=xprof, release_memory=True)
        except Exception as error:
            try:
                pickle.dumps(error)
            except Exception:
                error = RuntimeError(f"{type(error).__name__}: {error}")
            result = error
    relayed = [str(w.message) for w in caught if issubclass(w.category, XProfWarning)]
    return result, relayed


# -- many windows: every worker's trace of a job's window -----------------------------


@dataclass
class AnalyzedWindow:
    """One trace of ``analyze_windows``: its ``Breakdown``, or why it has none.

    Attributes:
        trace: the ``.xplane.pb`` file.
        facts: the facts it was analysed with (its worker's).
        breakdown: the result; None if the analysis failed.
        error: what the analysis raised (a torn or foreign file: ``ValueError`` naming
            it; a process that died: ``RuntimeError``); None if it succeeded.
    """

    trace: Path
    facts: RunFacts
    breakdown: object | None = None
    error: BaseException | None = None


def analyze_windows(
    windows: Iterable[tuple[str | os.PathLike, RunFacts | None]],
    jobs: int | None = None,
    *,
    xprof: bool | None = None,
    progress: Callable[[int, int, AnalyzedWindow], None] | None = None,
) -> list[AnalyzedWindow]:
    """Analyses many traces (e.g. every worker's trace of one profiler window), each with
    its own facts, in ``jobs`` processes at once; one trace's failure is its own.

    Each process (a child as the profiler's, ``python -m keras_dp_tools.analysis.runner``,
    which imports no TensorFlow) imports the analysis once and takes trace after trace
    (``analyze_window`` with ``release_memory``, as the profiler's child does: this
    process should do nothing else meanwhile; XProf's warning is relayed here). A
    trace that fails is that trace's error: a torn file's ``ValueError``, or a
    ``RuntimeError`` if its process died (out of memory) while on it; the others go on
    in the processes left, and traces no process could take are analysed each in a
    child of its own (``analyze_in_child``).

    Args:
        windows: (trace, facts) pairs; facts None: only what the trace says.
        jobs: processes at once; None: the cores this process may use. 1 analyses
            here, one trace after the other.
        xprof: as ``analyze_window``'s (None: XProf's step numbers for GPU traces).
        progress: called in this process as each trace is done, with (traces done,
            traces in all, its ``AnalyzedWindow``), in the order they finish.

    Returns:
        One ``AnalyzedWindow`` per trace, in the order of ``windows``.

    Example:
        >>> from keras_dp_tools.analysis.runner import analyze_windows
        >>> done = analyze_windows([], jobs=2)
        >>> done
        []
    """
    results = [AnalyzedWindow(Path(trace), facts or RunFacts()) for trace, facts in windows]
    jobs = usable_cores() if jobs is None else jobs
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, received {jobs}.")
    finished = 0

    def done(index: int, answered) -> None:
        nonlocal finished
        result, relayed = answered
        from keras_dp_tools.analysis.breakdown.xprof_steps import relay_warning

        for text in relayed:
            relay_warning(text)
        window = results[index]
        if isinstance(result, BaseException):
            window.error = result
        else:
            window.breakdown = result
        finished += 1
        if progress is not None:
            progress(finished, len(results), window)

    if jobs == 1 or len(results) <= 1:  # here, its warnings shown as they come
        from keras_dp_tools.analysis.breakdown.api import analyze_window

        for index, window in enumerate(results):
            try:
                result = analyze_window(
                    window.trace, window.facts, xprof=xprof, release_memory=True
                )
            except Exception as error:
                result = error
            done(index, (result, []))
        return results
    unanswered = _analyze_in_pool(results, min(jobs, len(results)), xprof, done)
    for index in unanswered:  # every process died (or none started): one at a time
        window = results[index]
        try:
            answered = analyze_in_child(window.trace, window.facts, xprof=xprof), []
        except Exception as error:
            answered = error, []
        done(index, answered)
    return results


def _analyze_in_pool(results: list[AnalyzedWindow], jobs: int, xprof, done) -> list[int]:
    """Analyses ``results``' traces in ``jobs`` child processes (this module's ``main``
    with ``--queue``), calling ``done`` with each answer as it comes; returns the
    indices of the traces that no process answered (none was left to take them)."""
    import time

    with tempfile.TemporaryDirectory(prefix="keras_dp_analysis_") as name:
        folder = Path(name)
        for index, window in enumerate(results):
            request = (str(window.trace), window.facts, 0, xprof)
            (folder / f"{index:07d}{_REQUEST}").write_bytes(pickle.dumps(request))
        children = []
        for number in range(jobs):
            with open(folder / f"child-{number}.err", "w") as errors:
                command = [*_child_command(), "--queue", str(folder)]
                try:
                    child = subprocess.Popen(command, env=_child_env(), stderr=errors)
                except OSError as error:
                    logger.debug("analysis process could not start (%s)", error)
                    break
                children.append((child, errors.name))
        pending = set(range(len(results)))
        while pending:
            running = any(child.poll() is None for child, _ in children)
            for index in sorted(pending):
                answer = folder / f"{index:07d}{_ANSWER}"
                if answer.exists():
                    pending.discard(index)
                    done(index, pickle.loads(answer.read_bytes()))
            if not running:
                break
            time.sleep(0.05)
        for child, _ in children:  # they end when no request is left: reaped here
            child.wait()
        # Taken by a process that died: that trace's failure, said with its last words.
        for child, errors in children:
            for claimed in folder.glob(f"*.{child.pid}{_CLAIMED}"):
                index = int(claimed.name.split(".")[0])
                if index in pending:
                    pending.discard(index)
                    last = " ".join(Path(errors).read_text().strip().splitlines()[-3:])
                    error = RuntimeError(
                        f"the analysis process exited with status {child.returncode} while "
                        f"analysing {results[index].trace}: {last}"
                    )
                    done(index, (error, []))
    return sorted(pending)


def _serve_queue(folder: Path) -> None:
    """A child of ``analyze_windows``: takes the requests in ``folder`` one at a time
    (renaming one claims it: no other process takes it then) and writes each answer
    beside it, until none is left."""
    for request in sorted(folder.glob(f"*{_REQUEST}")):
        index = request.name.split(".")[0]
        claimed = folder / f"{index}.{os.getpid()}{_CLAIMED}"
        try:
            os.rename(request, claimed)
        except FileNotFoundError:  # another process took it
            continue
        trace, facts, _, xprof = pickle.loads(claimed.read_bytes())
        written = folder / f"{index}.part"
        written.write_bytes(pickle.dumps(_analyze_here(trace, facts, xprof)))
        os.rename(written, folder / f"{index}{_ANSWER}")  # whole, or not there


_REQUEST, _CLAIMED, _ANSWER = ".request", ".claimed", ".answer"


def _child_command() -> list[str]:
    return [sys.executable, "-m", _CHILD_MODULE]


def _child_env() -> dict:
    """This process's environment, with the package this module is from first on the
    child's path."""
    import keras_dp_tools

    root = str(Path(keras_dp_tools.__file__).resolve().parent.parent)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}


# -- end of profiler windows ---------------------------------------------------------


# -- a finished run: the advice for RunAdvisor ------------------------------------


def run_advice_markdown(files: Iterable[tuple[str | os.PathLike, int]], run_id: str) -> str:
    """``Report.from_files(files).for_run(run_id).advice()`` as a markdown list
    (TensorBoard's Text tab, ``RunAdvisor``): the records ``files``, each read from a
    byte offset (``Recorder.run_offset``: this run's lines, not the runs before it).

    ``RunAdvisor`` gives one worker's file: of a multi-worker run given one file, the
    other workers' records were not read, so the finding that they recorded nothing
    (``missing-worker``) would be untrue; it is left out, and a last line says where
    the whole job's advice is.
    """
    from keras_dp_tools.analysis.advice import advice_markdown
    from keras_dp_tools.analysis.run_advice import advise_run
    from keras_dp_tools.analysis.run_frames import load_run_frames

    files = list(files)
    frames = load_run_frames(files).for_run(run_id)
    advice = advise_run(frames)
    workers = frames.runs["workers"].max() if not frames.runs.empty else None
    read = frames.runs["worker"].nunique()
    if len(files) > 1 or workers is None or not workers > read:
        return advice_markdown(advice)
    advice = [item for item in advice if item.code != "missing-worker"]
    return (
        advice_markdown(advice)
        + f"\n\n*From the records of {read} of the job's {int(workers)} workers: "
        "`kdt.Report.load(log_dir)` reads every worker's, for the cross-worker findings.*"
    )


if __name__ == "__main__":
    main()
