"""Candidates measured in interleaved rounds, each in its own process or processes.

The machinery ``tune_allreduce`` and ``compare_strategies`` share: start every
candidate's processes together, wait until each is ready (a contract error of the user's
functions is said once, not once per candidate), send each a profile command one at a
time (a profile must not share the CPU), then round after round, in a rotating order,
ask each to train a block of steps while the others wait. A slow phase of a shared
machine then hits every candidate alike. A candidate that fails or does not answer
within ``timeout`` is marked failed with the reason, its processes are stopped, and the
others carry on.

A candidate is a group of processes (one, or the workers of a multi-worker strategy):
every command goes to all of them, all must answer, and the first one's answer is the
candidate's.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from keras_dp_tools.common.text import error_reason, shortened
from keras_dp_tools.tools.tuning.child import (
    Child,
    ChildFailed,
    ChildTimedOut,
    ContractError,
    close_children,
)

WARMUP_STEPS = 3  # steps each child trains before anything is measured (its "warmup_steps")
PROFILE_STEPS = 3  # profiled steps per candidate
# Every candidate's processes start together: TensorFlow's default of mapping nearly all
# of a GPU's memory in the first process would leave the others none. (A trial's own
# processes, such as parameter servers, inherit it.)
SHARED_GPU_ENV = {"TF_FORCE_GPU_ALLOW_GROWTH": "true"}
_POLL_SECONDS = 0.05  # how often a group's processes are looked at in turn


@dataclass(frozen=True)
class Launch:
    """One process of a candidate: ``python -m module`` given ``spec``, its output in
    ``log_path``, ``env`` over the parent's environment."""

    module: str
    spec: dict
    log_path: Path
    env: dict | None = None


class Group:
    """A candidate's processes; the first one answers for the candidate."""

    def __init__(self, launches: list[Launch]):
        self.children: list[Child] = []
        try:
            for launch in launches:
                env = {**SHARED_GPU_ENV, **(launch.env or {})}
                self.children.append(Child(launch.module, launch.spec, launch.log_path, env))
        except BaseException:
            self.close(timeout=0)
            raise

    def _answers(self, timeout: float | None) -> dict:
        """Every process's next answer within ``timeout`` (all together); the first's.
        All are watched at once: the first to fail fails the group with its own error
        (worker 0 of a multi-worker strategy waits forever for a peer that failed)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        answers: dict[int, dict] = {}
        while len(answers) < len(self.children):
            for index, child in enumerate(self.children):
                if index not in answers:
                    with contextlib.suppress(ChildTimedOut):
                        answers[index] = child.wait(0)
            if len(answers) == len(self.children):
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise ChildTimedOut(f"timed out after {timeout:.0f} s")
            time.sleep(_POLL_SECONDS)
        return answers[0]

    def wait(self, timeout: float | None = None) -> dict:
        return self._answers(timeout)

    def request(self, command: dict, timeout: float | None = None) -> dict:
        for child in self.children:
            child.send(command)
        return self._answers(timeout)

    def close(self, timeout: float = 30) -> None:
        close_children(self.children, timeout)


@dataclass
class Outcome:
    """What each candidate answered: ``ready`` (its first answer), ``profile`` (the
    profile command's answer), ``blocks`` (the time commands' answers, in rounds) and
    ``failures`` (name -> reason) for those that failed on the way."""

    ready: dict[str, dict] = field(default_factory=dict)
    profile: dict[str, dict] = field(default_factory=dict)
    blocks: dict[str, list[dict]] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)

    @property
    def measured(self) -> list[str]:
        return [name for name in self.blocks if name not in self.failures]


def rotated(names: list[str], number: int) -> list[str]:
    """Round ``number``'s order: each round starts one candidate later."""
    if not names:
        return []
    shift = number % len(names)
    return names[shift:] + names[:shift]


def run_in_rounds(
    launches: dict[str, list[Launch]],
    *,
    block: int,
    rounds: int,
    timeout: float,
    say: Callable[[str], None],
    log_dir: Path,
    describe_ready: Callable[[dict], str] = lambda answer: "ready",
) -> Outcome:
    """Runs each candidate (name -> its processes) through: ready, ``{"profile":
    PROFILE_STEPS}``, then ``rounds`` interleaved ``{"time": block}`` commands. Never
    raises for one candidate's failure (it lands in ``Outcome.failures``); raises
    ``ContractError`` when the user's functions break the contract (every candidate would
    fail alike), after stopping every process.
    """
    outcome = Outcome()
    groups: dict[str, Group] = {}
    finished = False

    def fail(name: str, error: Exception) -> None:
        outcome.failures[name] = error_reason(str(error), 500)
        say(f"  {name}: failed: {shortened(outcome.failures[name], 300)}")
        group = groups.pop(name, None)
        if group is not None:
            group.close(timeout=5)

    try:
        for name, processes in launches.items():
            try:
                groups[name] = Group(processes)
            except OSError as error:
                fail(name, error)
        say(f"started {len(groups)} candidate(s) (logs under {log_dir})")
        for name in list(groups):
            try:
                outcome.ready[name] = groups[name].wait(timeout)
                say(f"  {name}: {describe_ready(outcome.ready[name])}")
            except ChildFailed as error:
                if error.contract:
                    raise ContractError(str(error)) from None
                fail(name, error)
        for name in list(groups):  # one at a time: a profile must not share the CPU
            say(f"profiling {name}")
            try:
                outcome.profile[name] = groups[name].request({"profile": PROFILE_STEPS}, timeout)
            except ChildFailed as error:
                fail(name, error)
        outcome.blocks = {name: [] for name in groups}
        for number in range(rounds):
            say(f"round {number + 1}/{rounds}: {block} steps each")
            for name in rotated(list(groups), number):
                try:
                    outcome.blocks[name].append(groups[name].request({"time": block}, timeout))
                except ChildFailed as error:
                    fail(name, error)
        finished = True
    finally:
        # Done: each gets its grace to end. Failed or interrupted (Ctrl-C, whose SIGINT
        # does not reach the trials' own sessions): every process is killed at once.
        close_children(
            [child for group in groups.values() for child in group.children],
            timeout=30 if finished else 0,
        )
    return outcome


def result_text(shown: str, decision: str, table, code: str | None) -> str:
    """A tuning result for people: the ``shown`` table, the ``decision`` in words, the
    reasons candidates were not measured (``table``'s ``reason`` column) and the
    ``code`` that builds the winner."""
    reasons = [
        f"  {row.candidate}: {row.reason}"
        for row in table.itertuples()
        if isinstance(row.reason, str)
    ]
    parts = [shown, "", decision]
    if reasons:
        parts += ["", "Not measured:", *reasons]
    if code:
        parts += ["", "Use it with:", code]
    return "\n".join(parts)
