"""The steps in parts (``StepParts``): every step's own columns, and the profiler's
breakdown of the few steps that have one, joined into the wide ``Report.steps`` only
when asked for; ``with_breakdown`` builds them.

Pure functions over DataFrames; no TensorFlow.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from keras_dp_tools.analysis.clocks import with_worker_wait
from keras_dp_tools.analysis.frame_columns import BREAKDOWN_COLUMNS, TIMED_STEP_COLUMNS
from keras_dp_tools.analysis.measured_steps import measured_step_rows, measured_step_times_of
from keras_dp_tools.analysis.step_keys import key_positions, taken


class StepParts:
    """``Report.steps`` in two parts, as the analysis reads it: ``all``, every step
    with the columns of its own (all but ``BREAKDOWN_COLUMNS``), and ``profiled``, the
    rows with a breakdown with every column. The wide frame holds ~35 columns empty on
    all but a few rows, most of the memory at cluster scale (benchmarks/NOTES.md);
    ``wide()`` builds it when a user asks for ``Report.steps``.

    Args:
        all: every step, without the breakdown's columns (or the wide frame itself).
        rows: the positions in ``all`` of the steps with a breakdown, ascending.
        breakdown: the breakdown's columns of those rows (one row each, in order), or
            None where ``all`` is the wide frame.

    Example:

    ```python
    import keras_dp_tools as kdt
    from keras_dp_tools.analysis.step_parts import step_parts

    parts = step_parts(kdt.Report.load("runs/demo").steps)
    print(len(parts.all), parts.profiled["comm_share"].median())
    ```
    """

    def __init__(self, all: pd.DataFrame, rows: np.ndarray, breakdown: pd.DataFrame | None):
        self.all, self.rows, self.breakdown = all, rows, breakdown
        self._profiled: pd.DataFrame | None = None
        self._measured_rows: tuple | None = None

    @classmethod
    def of_frame(cls, steps: pd.DataFrame) -> StepParts:
        """The parts of a wide steps frame (a ``Report`` made with one, ``for_run``):
        ``all`` is the frame itself."""
        present = [name for name in BREAKDOWN_COLUMNS if name in steps]
        rows = np.flatnonzero(steps[present].notna().to_numpy().any(axis=1))
        return cls(steps, rows, None)

    def with_all(self, all: pd.DataFrame) -> StepParts:
        """These parts with ``all`` replaced by a frame of the same rows (columns added)."""
        return StepParts(all, self.rows, self.breakdown)

    @property
    def profiled(self) -> pd.DataFrame:
        """The rows with a breakdown, every column of ``Report.steps``."""
        if self._profiled is None:
            mine = self.all.iloc[self.rows].reset_index(drop=True)
            if self.breakdown is not None:
                breakdown = self.breakdown.reset_index(drop=True)
                if len(self.rows) < len(self.all):  # typed as the wide frame's columns
                    gap, one = np.array([-1]), pd.RangeIndex(1)
                    filled = {name: taken(breakdown[name], gap, one).dtype for name in breakdown}
                    breakdown = breakdown.astype(filled)
                mine = pd.concat([mine, breakdown], axis=1)[self._order()]
            self._profiled = mine
        return self._profiled

    def measured(self, disturbed: bool = False) -> pd.DataFrame:
        """``analysis.measured_steps.measured_step_times`` of every step; the steps it groups are
        grouped once (the summary and each advice read it)."""
        if self._measured_rows is None:
            self._measured_rows = measured_step_rows(self.all)
        return measured_step_times_of(self._measured_rows, disturbed)

    def wide(self) -> pd.DataFrame:
        """``Report.steps``: every step with every column (the breakdown's empty on the
        steps that have none)."""
        if self.breakdown is None:
            return self.all
        position = np.full(len(self.all), -1)
        position[self.rows] = np.arange(len(self.rows))
        index = self.all.index
        columns = {
            name: taken(self.breakdown[name], position, index)
            if name in BREAKDOWN_COLUMNS
            else self.all[name]
            for name in self._order()
        }
        # copy=False: the columns are fresh or all's; stacking them into one block is slow.
        return pd.DataFrame(columns, copy=False)

    def for_run(self, run: str) -> StepParts:
        """The steps of one run id (``all`` itself where it holds that run alone)."""
        mine = (self.all["run"] == run).to_numpy()
        if mine.all():
            return self
        kept = mine[self.rows]
        breakdown = None if self.breakdown is None else self.breakdown[kept]
        rows = np.cumsum(mine)[self.rows[kept]] - 1  # positions among the run's rows
        return StepParts(self.all[mine].reset_index(drop=True), rows, breakdown)

    def __len__(self) -> int:
        return len(self.all)

    def _order(self) -> list[str]:
        later = [name for name in self.all.columns if name not in TIMED_STEP_COLUMNS]
        return [*TIMED_STEP_COLUMNS, *BREAKDOWN_COLUMNS, *later]


def step_parts(steps: pd.DataFrame | StepParts) -> StepParts:
    """The steps as ``StepParts``.

    Args:
        steps: ``Report.steps`` (the wide frame), or its parts already.

    Returns:
        ``steps`` itself where it is a ``StepParts``, else its parts.
    """
    return steps if isinstance(steps, StepParts) else StepParts.of_frame(steps)


def with_breakdown(steps: pd.DataFrame, breakdown: pd.DataFrame, sync: pd.DataFrame) -> StepParts:
    """The steps with the breakdown's columns after their own and each step's wait for
    other workers, in parts.

    ``clocks.with_worker_wait`` runs on the steps with a breakdown (where it also moves
    the wait from ``transfer_ms`` to ``sync_wait_ms``), a join gives the others theirs;
    the wide frame is built when it is asked for.

    Args:
        steps: ``frames.timed_steps``' steps (with ``_breakdown``).
        breakdown: ``frames.timed_steps``' breakdown.
        sync: ``clocks.cross_worker_sync`` of the steps.

    Returns:
        A ``StepParts``.
    """
    rows = steps["_breakdown"].to_numpy()
    steps = steps.drop(columns="_breakdown")
    later = [name for name in steps.columns if name not in TIMED_STEP_COLUMNS]
    order = [*TIMED_STEP_COLUMNS, *BREAKDOWN_COLUMNS, *later]
    # By run, step and worker: the order cross_worker_sync gives its rows (no sort).
    at_sync = None if sync.empty else key_positions(steps, sync, ["run", "step", "worker"])

    def plain() -> pd.DataFrame:  # every column of every step, then the wait
        wide = steps.reindex(columns=order)
        if not breakdown.empty:
            for name in BREAKDOWN_COLUMNS:
                wide[name] = taken(breakdown[name], rows, wide.index)
        return StepParts.of_frame(with_worker_wait(wide, sync))

    if at_sync is None and not sync.empty:
        return plain()
    if breakdown.empty:  # no profiled step: the breakdown's columns stay unbuilt, empty
        breakdown = pd.DataFrame({name: pd.Series(dtype=float) for name in BREAKDOWN_COLUMNS})
    profiled = np.flatnonzero(rows >= 0)
    some = pd.concat(
        [
            steps.iloc[profiled].reset_index(drop=True),
            breakdown[BREAKDOWN_COLUMNS].iloc[rows[profiled]].reset_index(drop=True),
        ],
        axis=1,
    )[order]
    # Without profiled steps, the whole sync (joined to no row) still types the columns.
    near = sync if sync.empty or some.empty else sync[sync["step"].isin(some["step"])]
    some = with_worker_wait(some, near)
    columns = {name: steps[name] for name in TIMED_STEP_COLUMNS}
    columns.update({name: steps[name] for name in later})
    if sync.empty:  # the wait's columns, empty, as with_worker_wait gives them
        own = with_worker_wait(pd.DataFrame(columns, copy=False), sync)
    else:
        added = [name for name in some.columns if name not in order]
        if set(added) - set(sync.columns):  # with_worker_wait adds more than the join has
            return plain()
        for name in added:  # typed as with_worker_wait types them
            columns[name] = taken(sync[name], at_sync, steps.index).astype(some[name].dtype)
        own = pd.DataFrame(columns, copy=False)
    return StepParts(own, profiled, some[BREAKDOWN_COLUMNS])
