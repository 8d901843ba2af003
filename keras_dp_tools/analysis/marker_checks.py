"""Step markers that cannot be true, found by rules every real capture obeys.

A marker's duration is what gives ``step_ms``; one that is damaged (or written by a
tool that got it wrong) would give a plausible-looking breakdown of a wrong interval.
XProf 2.24 shows it as is: a real CPU capture whose middle marker was made 1000 s long
gave a 1,000,000 ms step in its step table, which then lost the steps after it. Two
rules follow from how TensorFlow's profiler records host events (TSL's ``TraceMe``: an
event is kept only if it began after the session started and ended before it stopped;
it is a scope on its thread):

* **Within the capture.** The ``Task Environment`` plane holds the session's
  ``profile_start_time`` and ``profile_stop_time``, so no host event ends later than
  the capture's length after the earliest host event starts. Checked on the 637
  captures TF 2.21 made here (traces without the stats were built by tests): each has
  both stats, and in the 626 with our markers no event of any kind lies outside them
  (the last marker ended 82 us to 0.9 s before the stop).
* **One after another.** A thread's step markers (one per train call) never overlap.
  Checked on the 1,068 captures with our markers: none did. When two do, either may be
  the wrong one, so both are left out.

A step the rules reject keeps its row, with its numbers empty and the reason (see
``breakdown``); the other steps are analysed as usual. Note that a marker's end past
the last event of any other kind is no such rule: real captures often end with one
(509 of 1,060 here, by up to 24 ms).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from keras_dp_tools.analysis.xspace import StepMarker, named_stats

CAPTURE_PLANE = "Task Environment"
_START, _STOP = "profile_start_time", "profile_stop_time"  # ns, set by the profiler session


def capture_length_ps(space) -> int | None:
    """How long the profiler session ran (picoseconds), from the ``Task Environment``
    plane; None where the trace does not say (hand-built, or another producer)."""
    for plane in space.planes:
        if plane.name != CAPTURE_PLANE:
            continue
        names = {key: meta.name for key, meta in plane.stat_metadata.items()}
        stats = named_stats(plane.stats, names)
        start, stop = stats.get(_START), stats.get(_STOP)
        if isinstance(start, int) and isinstance(stop, int) and stop > start:
            return (stop - start) * 1000
    return None


def untrue_markers(
    markers: Sequence[StepMarker], earliest_ps: int | None, length_ps: int | None
) -> dict[int, str]:
    """Why each marker that cannot be true is not, by its index in ``markers``.

    Args:
        markers: the step markers, sorted by start.
        earliest_ps: the earliest start of any host event (absolute picoseconds).
        length_ps: ``capture_length_ps``; None skips the capture rule.
    """
    reasons: dict[int, str] = {}
    if earliest_ps is not None and length_ps is not None:
        latest = earliest_ps + length_ps
        for index, marker in enumerate(markers):
            if marker.end_ps > latest:
                reasons[index] = (
                    f"its marker ends {(marker.end_ps - latest) / 1e12:.6g} s after the "
                    f"capture stopped (the capture lasted {length_ps / 1e12:.6g} s), so its "
                    "duration is not the step's"
                )
    by_line: dict[str, list[int]] = defaultdict(list)
    for index, marker in enumerate(markers):
        if index not in reasons:
            by_line[marker.line].append(index)
    for line, indices in by_line.items():
        latest_end, latest = None, None  # the marker reaching furthest so far
        for index in indices:
            marker = markers[index]
            if latest_end is not None and latest_end > marker.start_ps:
                for one, other in ((index, latest), (latest, index)):
                    reasons.setdefault(
                        one,
                        f"its marker overlaps step {markers[other].step}'s on thread "
                        f"{line!r}, where step markers follow one another: one of the two "
                        "is wrong",
                    )
            if latest_end is None or marker.end_ps > latest_end:
                latest_end, latest = marker.end_ps, index
    return reasons
