"""Where TensorFlow's cross-thread profiler activities ended, read from real captures.

TensorFlow records ``CollectiveExecutor::CompleteParams`` (the resolution of a
collective's group and instance) with ``TraceMe::ActivityStart`` on the collective
thread that starts it and ``TraceMe::ActivityEnd`` in the resolution's callback. When
that callback runs on another thread (a gRPC thread: the group leader, worker 0, answered
over RPC), the activity is a cross-thread split event, the kind whose merge in
``TraceMeRecorder::Consume`` crashed profiled workers (docs/multiworker.md). A capture
keeps the merged event on the thread where it ended, so the thread kinds of these events
tell whether a capture held any.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

COMPLETE_PARAMS = "CollectiveExecutor::CompleteParams"
COLLECTIVE_THREADS = "collective_ops"  # where the activity starts (and, resolved locally, ends)


def complete_params_threads(log_dir) -> dict[str, Counter]:
    """Per capture under ``log_dir``: its ``CompleteParams`` events counted by the kind of
    thread they ended on (the line name up to its ``/``, e.g. ``collective_ops``,
    ``tf_GrpcWorkerEnvQueues``).

    Captures are keyed by worker (``"0"`` for ``train/``, ``"1"`` for
    ``train/worker-1/``: the DataParallelProfiler's folders) or, for other captures (a
    profiler server's, one file per address), by the file's name.
    """
    from keras_dp_tools.analysis.trace.xspace import host_planes, load_xspace, plane_events

    log_dir = Path(log_dir)
    counts: dict[str, Counter] = {}
    for trace in sorted(log_dir.glob("**/*.xplane.pb")):
        parts = trace.relative_to(log_dir).parts
        if parts[0] == "train":
            worker = parts[1].removeprefix("worker-") if parts[1].startswith("worker-") else "0"
        else:
            worker = trace.name.removesuffix(".xplane.pb")
        kinds = counts.setdefault(worker, Counter())
        for plane in host_planes(load_xspace(trace)):
            for event in plane_events(plane):
                if event.name == COMPLETE_PARAMS:
                    kinds[event.line.split("/")[0]] += 1
    return counts


def cross_thread(kinds: Counter) -> int:
    """How many of a capture's ``CompleteParams`` events ended off the collective threads."""
    return sum(count for kind, count in kinds.items() if kind != COLLECTIVE_THREADS)
