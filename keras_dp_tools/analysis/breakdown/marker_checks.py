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
  (the last marker ended 82 us to 0.9 s before the stop). Rechecked on the 279 still
  on disk later: none outside; on 58 of them the last other host event ended 0.95 ms
  to 0.92 s before the stop.
  The rule holds only where the stats are in the events' unit and clock: it is applied
  only when every host event but the markers fits in that length (otherwise a wrong
  stat would empty every step).
* **One after another.** A thread's step markers (one per train call) never overlap.
  Checked on the 1,068 captures with our markers: none did. When two do, either may be
  the wrong one, so both are left out. Markers of one step number that overlap (two
  profilers in one fit) are one step, kept as one by ``xspace.step_markers``; threads
  are told apart by their line id, not their name (every Python thread's is "python").

A step the rules reject keeps its row, with its numbers empty and the reason (see
``breakdown``); the other steps are analysed as usual. Note that a marker's end past
the last event of any other kind is no such rule: real captures often end with one
(509 of 1,060 here, by up to 24 ms).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import NamedTuple

from keras_dp_tools.analysis.trace.xspace import StepMarker, named_stats

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


class Untrue(NamedTuple):
    """Why a marker cannot be true: ``rule`` the same for every marker it rejects
    (``Breakdown.unmeasured`` groups steps by it), ``note`` this marker's case."""

    rule: str
    note: str


_OUTLASTS = (
    "the marker ends after the capture stopped (the capture lasted {:.6g} s), so its "
    "duration is not the step's"
)
_OVERLAPS = "the marker overlaps another step's on its thread, where markers follow one another"


def untrue_markers(
    markers: Sequence[StepMarker],
    host_extent: tuple[int, int | None] | None,
    length_ps: int | None,
) -> tuple[dict[int, Untrue], str | None]:
    """Why each marker that cannot be true is not, by its index in ``markers``; and
    why the capture rule was not applied, where it would have rejected a marker.

    Args:
        markers: the step markers, sorted by start.
        host_extent: the earliest start of any host event and the latest end of a host
            event other than a step marker (absolute picoseconds; None: none).
        length_ps: ``capture_length_ps``; None skips the capture rule.
    """
    reasons: dict[int, Untrue] = {}
    skipped = None
    if host_extent is not None and length_ps is not None:
        earliest, latest_other = host_extent
        latest = earliest + length_ps
        late = [index for index, marker in enumerate(markers) if marker.end_ps > latest]
        if late and latest_other is not None and latest_other > latest:
            skipped = (
                f"the capture's length ({length_ps / 1e12:.6g} s, Task Environment) was not "
                "checked against the step markers: other host events end "
                f"{(latest_other - latest) / 1e12:.6g} s after it (another unit or clock?)"
            )
        else:
            rule = _OUTLASTS.format(length_ps / 1e12)
            for index in late:
                beyond = (markers[index].end_ps - latest) / 1e12
                reasons[index] = Untrue(
                    rule,
                    f"its marker ends {beyond:.6g} s after the capture stopped (the capture "
                    f"lasted {length_ps / 1e12:.6g} s), so its duration is not the step's",
                )
    by_thread: dict[tuple, list[int]] = defaultdict(list)
    for index, marker in enumerate(markers):
        if index not in reasons:
            by_thread[marker.thread].append(index)
    for indices in by_thread.values():
        latest_end, latest = None, None  # the marker reaching furthest so far
        for index in indices:
            marker = markers[index]
            if latest_end is not None and latest_end > marker.start_ps:
                for one, other in ((index, latest), (latest, index)):
                    reasons.setdefault(
                        one,
                        Untrue(
                            _OVERLAPS,
                            f"its marker overlaps step {markers[other].step}'s on thread "
                            f"{marker.line!r}, where step markers follow one another: one "
                            "of the two is wrong",
                        ),
                    )
            if latest_end is None or marker.end_ps > latest_end:
                latest_end, latest = marker.end_ps, index
    return reasons, skipped


def summary(steps_by_rule: dict[str, list[int]]) -> str:
    """``Breakdown.unmeasured``'s text: the steps each rule rejected, as ranges."""
    parts = []
    for rule, steps in steps_by_rule.items():
        numbers = sorted(set(steps))
        if not numbers:
            continue
        runs, first = [], numbers[0]
        for previous, number in zip(numbers, [*numbers[1:], None], strict=True):
            if number != previous + 1:
                runs.append(str(first) if first == previous else f"{first}-{previous}")
                first = number
        label = "step" if len(numbers) == 1 else "steps"
        parts.append(f"{label} {', '.join(runs)} not measured: {rule}")
    return "; ".join(parts)
