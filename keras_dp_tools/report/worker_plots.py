"""Plots of a multi-worker run's workers: who keeps the job waiting, at 2 workers or 64.

``worker_view``: per worker, the median time it waited for the last worker to enter a
step, and the share of steps it entered last (the late worker waits least and enters
last: its bar of waits is the low one, its share the high one). ``worker_wait_map``: a
worker x step heat map of those waits, for many workers (steps averaged in bins where a
run has more than ``MAP_COLUMNS``). Both read ``Report.workers`` and ``Report.steps``
(``analysis.workers``: clocks aligned at the step ends) and return ``plots.Omitted``
on a run of one worker.

Example:

```python
import keras_dp_tools as kdt
from keras_dp_tools.report import worker_plots

report = kdt.Report.load("runs/job")
worker_plots.worker_view(report).savefig("workers.png")
```
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from keras_dp_tools.analysis.frames import steps_of
from keras_dp_tools.analysis.worker_digest import late_worker
from keras_dp_tools.report.plots import Omitted, run_part

MAP_COLUMNS = 400  # step bins of the heat map at most
_LATE_COLOUR = "#c44e52"
_OTHER_COLOUR = "#4c72b0"
_NO_WORKERS = "a run of one worker: no cross-worker waits (needs 2+ workers with kdt.StepTimer)"


def worker_view(report, run: str | None = None) -> Figure | Omitted:
    """Per worker: the median wait for the last worker to enter a step (left) and the
    share of steps it entered last (right); the late worker (``late_worker``: last in
    60% of the steps or more) in red and named in the title.

    Args:
        report: a ``kdt.Report``.
        run: the run id (default: the last run).

    Returns:
        The figure, or ``Omitted`` on a run without cross-worker waits.

    Example:

    ```python
    import keras_dp_tools as kdt
    from keras_dp_tools.report.worker_plots import worker_view

    worker_view(kdt.Report.load("runs/two_workers")).savefig("workers.png")
    ```
    """
    title = "Who keeps the job waiting"
    run, part = run_part(report, run)
    workers = part.workers.dropna(subset=["median_worker_wait_ms"])
    workers = workers.drop_duplicates("worker", keep="last").sort_values("worker")
    if workers["worker"].nunique() < 2:
        return Omitted(title, _NO_WORKERS)
    late = late_worker(part.workers, run)
    colours = [_LATE_COLOUR if worker == late else _OTHER_COLOUR for worker in workers["worker"]]
    figure = Figure(figsize=(10, 3.5), layout="constrained")
    waits, shares = figure.subplots(1, 2)
    positions = workers["worker"].astype("int64").to_numpy()
    waits.bar(positions, workers["median_worker_wait_ms"], color=colours)
    waits.set(
        title="Median wait for the last worker to enter a step",
        xlabel="worker",
        ylabel="ms per step",
    )
    shares.bar(positions, 100 * workers["last_to_enter_share"], color=colours)
    shares.set(title="Steps it entered last", xlabel="worker", ylabel="% of steps", ylim=(0, 100))
    for axes in (waits, shares):
        _worker_ticks(axes, positions)
    if late is not None:  # its bar of waits is the low one: point at it
        top = workers["median_worker_wait_ms"].max()
        waits.annotate(
            f"worker {late}",
            xy=(late, 0),
            xytext=(late, 1.12 * top if top > 0 else 1.0),
            ha="center",
            color=_LATE_COLOUR,
            arrowprops={"arrowstyle": "->", "color": _LATE_COLOUR},
        )
        waits.set_ylim(0, 1.3 * top if top > 0 else 1.5)
    heading = f"{title}: run {run}"
    if late is not None:
        share = workers.set_index("worker").loc[late, "last_to_enter_share"]
        heading += (
            f"; worker {late} entered {share:.0%} of the steps last (red): the others waited for it"
        )
    figure.suptitle(heading, fontsize="medium")
    return figure


def worker_wait_map(report, run: str | None = None) -> Figure | Omitted:
    """A worker x step heat map of each worker's wait for the last worker to enter the
    step (``Report.steps["worker_wait_ms"]``); the row that stays dark is the worker the
    others wait for. Over ``MAP_COLUMNS`` steps, each cell is the mean over a bin of
    consecutive steps.

    Args:
        report: a ``kdt.Report``.
        run: the run id (default: the last run).

    Returns:
        The figure, or ``Omitted`` on a run without cross-worker waits.

    Example:

    ```python
    import keras_dp_tools as kdt
    from keras_dp_tools.report.worker_plots import worker_wait_map

    worker_wait_map(kdt.Report.load("runs/two_workers")).savefig("waits.png")
    ```
    """
    title = "Wait for the last worker, per worker and step"
    run, part = run_part(report, run)
    # Its own columns only: the wide steps frame of millions of steps is not built.
    steps = steps_of(part).all[["worker", "step", "worker_wait_ms"]]
    steps = steps[steps["worker_wait_ms"].notna()]
    if steps["worker"].nunique() < 2:
        return Omitted(title, _NO_WORKERS)
    table, edges = wait_table(steps)
    figure = Figure(figsize=(10, 2.0 + 0.06 * len(table)), layout="constrained")
    axes = figure.subplots()
    image = axes.imshow(
        table.to_numpy(),
        aspect="auto",
        interpolation="nearest",
        cmap="viridis",
        extent=(edges[0] - 0.5, edges[-1] - 0.5, len(table) - 0.5, -0.5),
    )
    figure.colorbar(image, ax=axes, label="ms waited (mean over the bin)")
    late = late_worker(part.workers, run)
    every = max(1, int(np.ceil(len(table) / 32)))  # at most ~32 worker labels
    labels = [
        str(worker) if row % every == 0 or worker == late else ""
        for row, worker in enumerate(table.index)
    ]
    axes.set_yticks(range(len(table)), labels)
    for tick, worker in zip(axes.yaxis.get_major_ticks(), table.index, strict=False):
        if worker == late:
            tick.label1.set(color=_LATE_COLOUR, fontweight="bold")
    binned = len(edges) - 1 < steps["step"].nunique()
    axes.set(
        title=f"{title}: run {run}",
        xlabel="global step" + (" (bins of consecutive steps)" if binned else ""),
        ylabel="worker",
    )
    return figure


def wait_table(steps: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """Each worker's ``worker_wait_ms`` by step (rows: workers; columns: steps, or bins
    of consecutive steps, mean over the bin, at most ``MAP_COLUMNS``; NaN where a bin
    has none), and the columns' first steps followed by the last step plus one.

    Args:
        steps: rows with ``worker``, ``step`` and ``worker_wait_ms`` (no NaN waits).

    Returns:
        ``(table, edges)`` as above.

    Example:

    >>> import pandas as pd
    >>> from keras_dp_tools.report.worker_plots import wait_table
    >>> steps = pd.DataFrame({"worker": [0, 1, 0, 1], "step": [1, 1, 2, 2],
    ...                       "worker_wait_ms": [0.0, 4.0, 0.0, 6.0]})
    >>> table, edges = wait_table(steps)
    >>> table.values.tolist(), edges.tolist()
    ([[0.0, 0.0], [4.0, 6.0]], [1.0, 2.0, 3.0])
    """
    step = steps["step"].to_numpy(dtype="int64")
    wait = steps["worker_wait_ms"].to_numpy(dtype="float64")
    first, last = int(step.min()), int(step.max())
    count = min(MAP_COLUMNS, last - first + 1)
    edges = np.linspace(first, last + 1, count + 1)
    column = np.clip(np.searchsorted(edges, step, side="right") - 1, 0, count - 1)
    row, workers = pd.factorize(steps["worker"], sort=True)
    # Sums and counts per cell in one pass each (a grouping of millions of rows by two
    # keys took seconds).
    cell = row * count + column
    size = len(workers) * count
    sums = np.bincount(cell, weights=wait, minlength=size)
    counts = np.bincount(cell, minlength=size)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(counts > 0, sums / counts, np.nan).reshape(len(workers), count)
    index = pd.Index(workers, name="worker")
    return pd.DataFrame(means, index=index, columns=pd.RangeIndex(count, name="column")), edges


def _worker_ticks(axes, positions: np.ndarray) -> None:
    every = max(1, int(np.ceil(len(positions) / 16)))
    shown = positions[::every]
    axes.set_xticks(shown, [str(worker) for worker in shown])
