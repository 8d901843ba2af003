"""Plots of a ``Report`` (matplotlib), and its summary as a table for people.

Each plot function returns a ``Figure``, or an ``Omitted`` that says in one line why there
is nothing to draw (no GPU on a CPU run, no profiler window): a notebook shows that line,
the HTML report prints it in place of the figure. The notebook, ``keras-dp report --html``
and any other view use these functions, so a plot is fixed once, here.

Figures are made with ``matplotlib.figure.Figure`` rather than pyplot, so they work in
scripts and servers without a display; notebooks show a returned Figure as is.

Profiled steps are a few short windows (say steps 10-14, 110-114, 210-214). Plots of
them put the windows side by side on a step axis with an empty slot between windows,
and draw each window's points as their own line: a line never joins steps across the
unmeasured steps between windows.

Example:

```python
import keras_dp_tools as kdt
from keras_dp_tools.report import plots

report = kdt.Report.load("runs/demo-20261129-093000")
figure = plots.step_breakdown(report)
if isinstance(figure, plots.Omitted):
    print(figure)  # e.g. "Where each profiled step goes: no profiled steps (...)"
else:
    figure.savefig("breakdown.png")
print(plots.summary_table(report).to_string(index=False))
```
"""

from __future__ import annotations

import math
import os
import textwrap
from dataclasses import dataclass

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from keras_dp_tools.analysis.worker_digest import late_worker, shortest_own_steps
from keras_dp_tools.report import summary_fields
from keras_dp_tools.report.step_lines import (
    MAX_LEGEND,
    draw_own_step_times,
    job_steps,
    legend_or_count,
)

# Exclusive parts of a step, bottom to top, with their colours.
_PARTS = {
    "compute_ms": ("compute", "#4c72b0"),
    "exposed_transfer_ms": ("all-reduce transfer (exposed)", "#dd8452"),
    "exposed_sync_wait_ms": ("waiting for slowest replica", "#c44e52"),
    "input_ms": ("input", "#55a868"),
    "other_ms": ("other (host, launch, idle)", "#b3b3b3"),
}
# comm_share's lines: the share's column, its label, marker and colour (its part's).
_SHARES = (
    ("comm_share", "comm share (transfer)", "o", _PARTS["exposed_transfer_ms"][1]),
    ("wait_share", "wait share", "s", _PARTS["exposed_sync_wait_ms"][1]),
)
_NO_PROFILE = "no profiled steps (add kdt.DataParallelProfiler)"
_WARMUP_COLOUR = "#c44e52"
_PROFILED_COLOUR = "#f0b27a"
_MAX_STEP_LABELS = 40


@dataclass(frozen=True)
class Omitted:
    """What a plot function returns when there is nothing to draw: the plot's title and
    the reason, shown as one line (``str``, ``repr``, a notebook's output)."""

    title: str
    reason: str

    def __str__(self) -> str:
        return f"{self.title}: {self.reason}"

    __repr__ = __str__

    def savefig(self, *args, **kwargs):
        raise ValueError(
            f"Nothing to save, the plot was left out ({self}). Check "
            "isinstance(result, keras_dp_tools.report.plots.Omitted) before saving."
        )


def run_part(report, run: str | None) -> tuple[str, object]:
    """The run id a plot draws (``run``, default the last run) and the report of it
    alone (``Report.for_run``); raises ValueError for a run the report lacks."""
    runs = list(report.runs["run"].drop_duplicates())
    if not runs:
        raise ValueError("The report holds no runs.")
    if run is None:
        run = runs[-1]
    elif run not in runs:
        raise ValueError(f"No run {run!r} in the report; it has {', '.join(runs)}.")
    return run, report.for_run(run)


def _empty(figure: Figure, axes, message: str) -> Figure:
    axes.text(0.5, 0.5, message, ha="center", va="center", transform=axes.transAxes)
    axes.set_axis_off()
    return figure


def window_labels(rows: pd.DataFrame, windows: pd.DataFrame) -> pd.Series:
    """The profiler window each row (``run``, ``worker``, ``step``) was captured in,
    numbered per worker: the window that started last at or before the step. Without
    window records, a step that does not follow the previous one starts a new window."""
    captured = windows[windows["status"] != "skipped"].dropna(subset=["start_step"])
    labels = pd.Series(0, index=rows.index, dtype="int64")
    for (run, worker), part in rows.groupby(["run", "worker"], sort=False):
        mine = captured[(captured["run"] == run) & (captured["worker"] == worker)]
        starts = np.sort(mine["start_step"].astype("int64").unique())
        if len(starts):
            labels[part.index] = np.searchsorted(starts, part["step"].to_numpy(), side="right")
        else:
            ordered = part["step"].sort_values()
            labels[ordered.index] = (ordered.diff() != 1).cumsum().to_numpy()
    return labels


class _StepAxis:
    """Profiled steps side by side, an empty slot between windows, labelled by step."""

    def __init__(self, rows: pd.DataFrame, windows: pd.DataFrame):
        self.labels = window_labels(rows, windows)
        members = (
            pd.DataFrame({"step": rows["step"].astype("int64"), "worker": rows["worker"]})
            .assign(window_index=self.labels)
            .groupby("step")[["worker", "window_index"]]
            .apply(lambda group: set(zip(group["worker"], group["window_index"], strict=True)))
            .sort_index()
        )
        self.positions: dict[int, int] = {}
        self.gaps: list[int] = []
        position, previous = -1, None
        for step, keys in members.items():
            if previous is not None and not previous & keys:
                position += 1  # an empty slot: the steps in between were not measured
                self.gaps.append(position)
            position += 1
            self.positions[int(step)] = position
            previous = keys

    def x(self, steps: pd.Series) -> np.ndarray:
        return steps.astype("int64").map(self.positions).to_numpy(dtype=float)

    def draw(self, axes) -> None:
        steps = list(self.positions)
        every = max(1, math.ceil(len(steps) / _MAX_STEP_LABELS))
        shown = steps[::every]
        axes.set_xticks([self.positions[s] for s in shown], [str(s) for s in shown], rotation=90)
        for gap in self.gaps:
            axes.axvline(gap, color="#cccccc", linestyle=":", linewidth=1)
        axes.set_xlim(-0.7, max(self.positions.values()) + 0.7)
        axes.set_xlabel("global step (dotted: unmeasured steps left out)")

    def lines(self, axes, rows: pd.DataFrame, values: pd.Series, label: str, **style) -> None:
        """One Line2D per window, so no line crosses a gap; the legend names it once."""
        frame = pd.DataFrame(
            {"x": self.x(rows["step"]), "y": values, "window_index": self.labels[rows.index]}
        )
        for number, (_, segment) in enumerate(frame.sort_values("x").groupby("window_index")):
            axes.plot(
                segment["x"], segment["y"], label=label if number == 0 else "_nolegend_", **style
            )


@dataclass(frozen=True)
class _ProfiledFigure:
    """What a figure over profiled steps starts from: its run's profiled rows, their
    step axis and an empty figure."""

    title: str
    run: str
    rows: pd.DataFrame
    axis: _StepAxis
    figure: Figure

    @property
    def heading(self) -> str:
        return f"{self.title}: run {self.run}"


def _profiled_figure(
    report, run: str | None, title: str, size: tuple, frame="steps", measured="trace_step_ms"
) -> _ProfiledFigure | Omitted:
    """The run's rows of ``frame`` (``steps`` or ``replicas``) where a profiler measured
    ``measured``, on a step axis; ``Omitted`` when it measured none."""
    run, part = run_part(report, run)
    rows = getattr(part, frame).dropna(subset=[measured])
    if rows.empty:
        return Omitted(title, _NO_PROFILE)
    axis = _StepAxis(rows, part.windows)
    return _ProfiledFigure(title, run, rows, axis, Figure(figsize=size, layout="constrained"))


def step_breakdown(report, run: str | None = None) -> Figure | Omitted:
    """Stacked bars per profiled step: compute, exposed transfer and wait, input, other
    (averaged over replicas; they add up to the step time). With several profiled
    workers, their bars stand side by side."""
    profiled = _profiled_figure(report, run, "Where each profiled step goes", (9, 4))
    if isinstance(profiled, Omitted):
        return profiled
    steps, axis, axes = profiled.rows, profiled.axis, profiled.figure.subplots()
    workers = sorted(int(worker) for worker in steps["worker"].unique())
    width = 0.8 / len(workers)
    for offset, worker in enumerate(workers):
        rows = steps[steps["worker"] == worker]
        positions = axis.x(rows["step"]) + (offset - (len(workers) - 1) / 2) * width
        bottom = np.zeros(len(rows))
        for column, (label, colour) in _PARTS.items():
            values = rows[column].fillna(0.0).to_numpy()
            label = label if offset == 0 else "_nolegend_"
            axes.bar(
                positions,
                values,
                bottom=bottom,
                label=label,
                color=colour,
                width=width,
                edgecolor="white",
                linewidth=0.5,
            )
            bottom = bottom + values
    axis.draw(axes)
    if len(workers) > 1:
        order = ", ".join(map(str, workers))
        axes.set_xlabel(f"{axes.get_xlabel()}; bars left to right: workers {order}")
    axes.set(title=profiled.heading, ylabel="ms per step (mean over replicas)")
    axes.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    return profiled.figure


def comm_share(report, run: str | None = None) -> Figure | Omitted:
    """Exposed all-reduce transfer and sync-wait shares of each profiled step, in percent,
    one line per profiler window."""
    profiled = _profiled_figure(report, run, "Communication over steps", (9, 3.5))
    if isinstance(profiled, Omitted):
        return profiled
    steps, axis, axes = profiled.rows, profiled.axis, profiled.figure.subplots()
    several = steps["worker"].nunique() > 1
    styles = ["-", "--", ":", "-."]
    for number, (worker, rows) in enumerate(steps.groupby("worker")):
        prefix = f"worker {worker}: " if several else ""
        for column, label, marker, colour in _SHARES:
            axis.lines(
                axes,
                rows,
                100 * rows[column],
                f"{prefix}{label}",
                marker=marker,
                color=colour,
                linestyle=styles[number % len(styles)],
            )
    axis.draw(axes)
    axes.set(title=profiled.heading, ylabel="% of step time", ylim=(0, None))
    legend_or_count(axes, steps["worker"].nunique() * len(_SHARES), "lines")
    return profiled.figure


def sync_wait(report, run: str | None = None) -> Figure | Omitted:
    """The straggler view: sync wait of each replica per profiled step (left, one line per
    replica and window) and on average (right). The replica that waits least arrived
    last: the others wait for it."""
    profiled = _profiled_figure(
        report, run, "Sync wait per replica", (10, 3.5), "replicas", "sync_wait_ms"
    )
    if isinstance(profiled, Omitted):
        return profiled
    replicas, axis = profiled.rows, profiled.axis
    left, right = profiled.figure.subplots(1, 2, width_ratios=[3, 1])
    several = replicas["worker"].nunique() > 1
    names, means = [], []
    for number, ((worker, replica), rows) in enumerate(replicas.groupby(["worker", "replica"])):
        name = f"w{worker} r{replica}" if several else f"{replica}"
        axis.lines(
            left,
            rows,
            rows["sync_wait_ms"],
            f"worker {worker} replica {replica}" if several else f"replica {replica}",
            marker=".",
            color=f"C{number % 10}",
        )
        names.append(name)
        means.append(rows["sync_wait_ms"].mean())
    axis.draw(left)
    left.set(title=profiled.heading, ylabel="ms")
    legend_or_count(left, len(names), "replicas, a line each")
    positions = np.arange(len(names))
    right.bar(positions, means, color=_PARTS["exposed_sync_wait_ms"][1])
    every = max(1, math.ceil(len(names) / MAX_LEGEND))  # labels that fit under the bars
    right.set_xticks(positions[::every], names[::every], rotation=90 if every > 1 else 0)
    right.set(title="Mean", xlabel="replica", ylabel="ms (mean over profiled steps)")
    steps = report.step_parts.all
    mine = steps["run"] == profiled.run
    if "worker_wait_ms" in steps and steps.loc[mine, "worker_wait_ms"].notna().any():
        profiled.figure.suptitle(
            "Each worker's trace holds its own replicas only: their wait for another "
            "worker is not in these lines (see the worker view; Report.steps' "
            "sync_wait_ms has it)",
            fontsize="small",
        )
    return profiled.figure


def gpu_utilization(report, run: str | None = None) -> Figure | Omitted:
    """NVML utilization of each GPU over the run's time; ``Omitted`` with GpuMonitor's
    reason where there are no readings (a CPU run)."""
    title = "GPU utilization"
    run, part = run_part(report, run)
    gpu = part.gpu.dropna(subset=["util_gpu"])
    if gpu.empty:
        reason = part.runs["gpu_reason"].dropna()
        why = reason.iloc[-1] if len(reason) else "GpuMonitor recorded nothing"
        return Omitted(title, f"no GPU readings: {why}")
    figure = Figure(figsize=(9, 3.5), layout="constrained")
    axes = figure.subplots()
    start = gpu["time"].min()
    for (worker, device), readings in gpu.groupby(["worker", "gpu"]):
        readings = readings.sort_values("time")
        axes.plot(
            readings["time"] - start, readings["util_gpu"], label=f"worker {worker} GPU {device}"
        )
    axes.set(
        title=f"{title}: run {run}",
        xlabel="seconds since the first reading",
        ylabel="% of time a kernel ran",
        ylim=(0, 105),
    )
    axes.legend(fontsize="small")
    return figure


def scaling(report) -> Figure:
    """Throughput against replicas: measured and ideal (linear from the smallest run),
    with the scaling efficiency of each point. With fewer than two replica counts the
    figure says so (``keras-dp sweep`` saves it as a file either way)."""
    table = report.compare()
    figure = Figure(figsize=(6, 4), layout="constrained")
    axes = figure.subplots()
    if len(table) < 2:
        return _empty(figure, axes, "Needs runs at two or more replica counts (keras-dp sweep).")
    ideal = table["throughput"].iloc[0] * table["replicas"] / table["replicas"].iloc[0]
    axes.plot(table["replicas"], ideal, linestyle="--", color="grey", label="ideal (linear)")
    axes.plot(table["replicas"], table["throughput"], marker="o", label="measured")
    for row in table.itertuples():
        axes.annotate(
            f"{row.scaling_efficiency:.0%}",
            (row.replicas, row.throughput),
            textcoords="offset points",
            xytext=(0, 8),
            ha="center",
        )
    unit = "examples/s" if table["global_batch"].notna().all() else "steps/s"
    axes.set(title="Scaling", xlabel="replicas", ylabel=unit)
    axes.set_xticks(table["replicas"].tolist())
    axes.legend()
    return figure


def _spans(steps: pd.DataFrame, flag: pd.Series) -> list[tuple[float, float]]:
    """Runs of consecutive step records with ``flag`` set, as (first, past-last) steps."""
    per_step = (
        pd.DataFrame({"step": steps["step"], "steps": steps["steps"].fillna(1), "flag": flag})
        .groupby("step")
        .agg(steps=("steps", "max"), flag=("flag", "any"))
        .reset_index()
    )
    run = (per_step["flag"] != per_step["flag"].shift()).cumsum()
    spans = []
    for _, group in per_step[per_step["flag"]].groupby(run[per_step["flag"]]):
        spans.append((group["step"].iloc[0], group["step"].iloc[-1] + group["steps"].iloc[-1]))
    return spans


def step_time(report, run: str | None = None) -> Figure | Omitted:
    """Host wall time of every step, with warm-up calls (tracing, compilation: the
    ``warmup`` column) as red crosses and profiled steps (a capture or its analysis ran:
    ``profiled``) shaded. The y axis fits the steady steps; steps above it are marked at
    the top edge and their largest time written there."""
    title = "Wall time per step"
    run, part = run_part(report, run)
    # The steps' own columns: the wide frame (breakdown columns) is not built for this.
    steps = part.step_parts.all.dropna(subset=["step_ms"])
    if steps.empty:
        return Omitted(title, "no timed steps (add kdt.StepTimer)")
    warmup = steps["warmup"].fillna(False).astype(bool)
    profiled = steps["profiled"].fillna(False).astype(bool) & ~warmup
    steady = steps["step_ms"][~warmup & ~profiled]
    figure = Figure(figsize=(9, 3.5), layout="constrained")
    axes = figure.subplots()
    for number, (first, end) in enumerate(_spans(steps, profiled)):
        label = "profiled (capture or its analysis)" if number == 0 else "_nolegend_"
        axes.axvspan(first - 0.5, end - 0.5, color=_PROFILED_COLOUR, alpha=0.35, label=label)
    several = steps["worker"].nunique() > 1
    job = job_steps(steps) if several else steps.iloc[:0]
    if not job.empty:  # the job's pace first; each worker's own time is shorter
        steady = job["job_step_ms"][~job["warmup"] & ~job["profiled"]]
        draw_own_step_times(axes, steps)
        axes.plot(
            job["step"],
            job["job_step_ms"],
            label="the job (shared step end to the next)",
            color="black",
            linewidth=1.0,
        )
    else:
        for worker, rows in steps.groupby("worker"):
            label = f"worker {worker}" if several else "every step"
            axes.plot(rows["step"], rows["step_ms"], label=label, linewidth=0.8)
    if warmup.any():
        rows = steps[warmup]
        axes.scatter(
            rows["step"],
            rows["step_ms"],
            marker="x",
            color=_WARMUP_COLOUR,
            zorder=3,
            label="warm-up (tracing, compilation)",
        )
    # Fit the y axis to the steady steps; mark the steps above it at the top edge (the
    # job's too).
    top = 1.5 * steady.quantile(0.99) if len(steady) else math.inf
    points = pd.DataFrame({"step": steps["step"], "step_ms": steps["step_ms"]})
    points = points.assign(warmup=warmup, profiled=profiled)
    if not job.empty:
        shared = job[["step", "warmup"]].assign(
            step_ms=job["job_step_ms"], profiled=job["profiled"] & ~job["warmup"]
        )
        points = pd.concat([points, shared], ignore_index=True)
    warmup, profiled = points["warmup"], points["profiled"]
    above = points["step_ms"] > top
    if above.any():
        notes = []
        for kind, mask, colour in (
            ("warm-up", warmup, _WARMUP_COLOUR),
            ("profiled", profiled, _PROFILED_COLOUR),
            ("other", ~warmup & ~profiled, "C0"),
        ):
            rows = points[above & mask]
            if len(rows):
                notes.append(f"{kind} up to {rows['step_ms'].max():.0f} ms")
                axes.scatter(
                    rows["step"],
                    np.full(len(rows), top),
                    marker="^",
                    color=colour,
                    edgecolor="black",
                    clip_on=False,
                    zorder=4,
                )
        axes.set_ylim(0, top)
        xlabel = f"global step\n\u25b2 above the scale: {', '.join(notes)}"
    else:
        axes.set_ylim(0, None)
        xlabel = "global step"
    late = late_worker(part.workers, run) if not job.empty else None
    if late is not None and shortest_own_steps(steps, run, late):
        figure.suptitle(
            f"Worker {late} enters most steps last, so it waits least: its own step times "
            "are the shortest. The job steps at the black line's pace.",
            fontsize="small",
            color=_WARMUP_COLOUR,
        )
    axes.set(title=f"{title}: run {run}", xlabel=xlabel, ylabel="ms")
    axes.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    return figure


def summary_table(report) -> pd.DataFrame:
    """``report.summary()`` for people: one row per field with columns ``field`` (the
    summary's column, e.g. ``comm_share``), ``label`` ("Communication share"), ``unit``
    ("%") and the value as shown (shares in %, "not measured" where the run has none),
    one column per run (named ``value`` when there is one run). The same table as
    ``Report.text()``, the HTML report and the dashboard
    (``keras_dp_tools.report.summary_fields``)."""
    return summary_fields.summary_table(report.summary(advice=False))


def worker_wait(report, run: str | None = None) -> Figure | Omitted:
    """Per step, how long each worker waited for the last worker to enter the step
    (multi-worker runs; clocks aligned at the step ends, see ``Report.workers``)."""
    run, part = run_part(report, run)
    title = f"Waiting for other workers: run {run}"
    steps = part.step_parts.all.dropna(subset=["worker_wait_ms"])
    if steps.empty:
        return Omitted(title, "no cross-worker waits (needs 2+ workers with kdt.StepTimer)")
    figure = Figure(figsize=(8, 3), layout="constrained")
    axes = figure.subplots()
    for worker, rows in steps.groupby("worker"):
        axes.plot(rows["step"], rows["worker_wait_ms"], label=f"worker {worker}", linewidth=0.8)
    axes.set(title=title, xlabel="global step", ylabel="ms")
    axes.legend()
    return figure


def strategy_comparison(comparison) -> Figure | Omitted:
    """Examples per second of each measured strategy (the median over rounds), with
    whiskers from the slowest to the fastest round; the candidates that failed or were
    skipped are listed under the chart. ``comparison``: a ``StrategyComparison``
    (``kdt.compare_strategies``, or ``StrategyComparison.load(log_dir)``), or the log dir
    that holds its ``strategy_comparison.json``.

    Example:

    ```python
    import keras_dp_tools as kdt

    comparison = kdt.StrategyComparison.load("runs/strategies")
    kdt.plots.strategy_comparison(comparison).savefig("strategies.png")
    ```
    """
    if isinstance(comparison, (str, os.PathLike)):
        from keras_dp_tools.report.comparison import RecordedComparison

        comparison = RecordedComparison.load(comparison)
    title = "Examples per second by strategy"
    table = comparison.table
    measured = table[table["status"] == "measured"].dropna(subset=["examples_per_s"])
    missing = [
        f"{row.candidate}: {row.status} ({row.reason})"
        for row in table[table["status"] != "measured"].itertuples()
    ]
    if measured.empty:
        return Omitted(title, "no candidate was measured" + (f" ({'; '.join(missing)})"))
    rates = [
        list(value) if len(value) else [rate]
        for value, rate in zip(
            measured["round_examples_per_s"], measured["examples_per_s"], strict=True
        )
    ]
    medians = measured["examples_per_s"].to_numpy(float)
    whiskers = np.array([medians - [min(r) for r in rates], [max(r) for r in rates] - medians])
    figure = Figure(figsize=(7, 3.2 + 0.25 * len(missing)), layout="constrained")
    axes = figure.subplots()
    positions = np.arange(len(measured))
    winner, other = "#55a868", "#4c72b0"
    colours = [winner if name == comparison.best else other for name in measured["candidate"]]
    axes.bar(positions, medians, width=0.6, yerr=whiskers, capsize=4, color=colours)
    axes.set_xlim(-0.75, len(measured) - 0.25)
    labels = [
        f"{name}\n{speedup:.2f}x" if pd.notna(speedup) else name
        for name, speedup in zip(measured["candidate"], measured["speedup"], strict=True)
    ]
    axes.set_xticks(positions, labels)
    axes.set(title=title, ylabel="examples/s (median over rounds)")
    if missing:  # a figure-level label: the constrained layout makes room for it
        caption = textwrap.fill("Not measured: " + "; ".join(missing), 110)
        figure.supxlabel(caption, fontsize=8, ha="left", x=0.01)
    return figure
