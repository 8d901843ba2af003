"""Global step numbering shared by callbacks: which optimizer steps a train call covers."""

from __future__ import annotations

from keras_dp_tools.capture.run_info import fit_epoch_steps, global_step


class StepCounter:
    """Follows ``optimizer.iterations`` through the batch hooks without reading it each step.

    Keras calls the batch hooks once per call of the train function, which runs up to
    ``steps_per_execution`` steps; ``batch`` numbers steps within the epoch. The steps
    a call ran are counted from ``batch`` (the data's steps): ``optimizer.iterations``
    is read only for a call of several steps in an epoch of unknown length, where it
    misses the steps Keras 3's ``LossScaleOptimizer`` skips (non-finite gradients).
    """

    def __init__(self):
        self.model = None
        self.next_step = 0  # global step the next call starts at
        self.calls = 0  # calls finished in this fit
        self._first_batch = 0
        self._epoch_steps: int | None = None  # this fit's steps per epoch, if known

    def start(self, model) -> None:
        """At the start of a fit: continue from the optimizer's step count."""
        self.model = model
        self.next_step = global_step(model) or 0
        self.calls = 0
        self._epoch_steps = fit_epoch_steps()

    def begin_call(self, batch: int) -> int:
        """At a call's batch-begin hook; returns the global step it starts at."""
        self._first_batch = batch
        return self.next_step

    def end_call(self, batch: int) -> tuple[int, int]:
        """At the call's batch-end hook; returns (first global step, steps covered)."""
        steps = batch - self._first_batch + 1
        if steps > 1 and self._epoch_steps:
            # Keras 3 numbers a short last call of an epoch as if it were full.
            steps = min(batch, self._epoch_steps - 1) - self._first_batch + 1
        elif steps > 1:
            # Nor is the epoch's length known: trust the optimizer. (One variable read;
            # the step's logs were fetched already.)
            applied = (global_step(self.model) or 0) - self.next_step
            steps = applied if 0 < applied <= steps else steps
        first = self.next_step
        self.next_step += steps
        self.calls += 1
        return first, steps
