"""Plots of a ``Report`` (matplotlib). Each function returns a ``Figure``.

Figures are made with ``matplotlib.figure.Figure`` rather than pyplot, so they work in
scripts and servers without a display; notebooks show a returned Figure as is.

Example:

```python
import keras_dp_tools as kdt
from keras_dp_tools import plots

report = kdt.Report.load("runs/demo-20261129-093000")
plots.step_breakdown(report).savefig("breakdown.png")
```
"""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

# Exclusive parts of a step, bottom to top, with their colours.
_PARTS = {
    "compute_ms": ("compute", "#4c72b0"),
    "exposed_transfer_ms": ("all-reduce transfer (exposed)", "#dd8452"),
    "exposed_sync_wait_ms": ("waiting for slowest replica", "#c44e52"),
    "input_ms": ("input", "#55a868"),
    "other_ms": ("other (host, launch, idle)", "#b3b3b3"),
}


def _run(report, run: str | None) -> tuple[str, object]:
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


def step_breakdown(report, run: str | None = None) -> Figure:
    """Stacked bars per profiled step: compute, exposed transfer and wait, input, other
    (averaged over replicas; they add up to the step time)."""
    run, part = _run(report, run)
    steps = part.steps.dropna(subset=["trace_step_ms"])
    figure = Figure(figsize=(9, 4), layout="constrained")
    axes = figure.subplots()
    if steps.empty:
        return _empty(figure, axes, "No profiled steps (add kdt.DataParallelProfiler).")
    positions = range(len(steps))
    bottom = pd.Series(0.0, index=steps.index)
    for column, (label, colour) in _PARTS.items():
        values = steps[column].fillna(0.0)
        axes.bar(positions, values, bottom=bottom, label=label, color=colour, width=0.8)
        bottom = bottom + values
    axes.set_xticks(list(positions), steps["step"].astype(int).astype(str), rotation=90)
    axes.set(
        title=f"Where each profiled step goes: run {run}",
        xlabel="global step",
        ylabel="ms per step (mean over replicas)",
    )
    axes.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    return figure


def comm_share(report, run: str | None = None) -> Figure:
    """Exposed all-reduce transfer and sync-wait shares of each profiled step."""
    run, part = _run(report, run)
    steps = part.steps.dropna(subset=["trace_step_ms"])
    figure = Figure(figsize=(8, 3.5), layout="constrained")
    axes = figure.subplots()
    if steps.empty:
        return _empty(figure, axes, "No profiled steps (add kdt.DataParallelProfiler).")
    axes.plot(steps["step"], 100 * steps["comm_share"], marker="o", label="comm share (transfer)")
    axes.plot(steps["step"], 100 * steps["wait_share"], marker="s", label="wait share")
    axes.set(
        title=f"Communication over steps: run {run}",
        xlabel="global step",
        ylabel="% of step time",
        ylim=(0, None),
    )
    axes.legend()
    return figure


def sync_wait(report, run: str | None = None) -> Figure:
    """The straggler view: sync wait of each replica per profiled step (left) and on
    average (right). The replica that waits least arrived last: the others wait for it."""
    run, part = _run(report, run)
    replicas = part.replicas
    figure = Figure(figsize=(10, 3.5), layout="constrained")
    left, right = figure.subplots(1, 2, width_ratios=[3, 1])
    if replicas.empty:
        _empty(figure, right, "")
        return _empty(figure, left, "No profiled steps (add kdt.DataParallelProfiler).")
    table = replicas.pivot_table(index="step", columns="replica", values="sync_wait_ms")
    for replica in table.columns:
        left.plot(table.index, table[replica], marker=".", label=f"replica {replica}")
    left.set(title=f"Sync wait per replica: run {run}", xlabel="global step", ylabel="ms")
    left.legend(fontsize="small")
    means = table.mean()
    right.bar([str(r) for r in means.index], means.to_numpy(), color="#c44e52")
    right.set(title="Mean", xlabel="replica", ylabel="ms")
    return figure


def gpu_utilization(report, run: str | None = None) -> Figure:
    """NVML utilization of each GPU over the run's time."""
    run, part = _run(report, run)
    gpu = part.gpu.dropna(subset=["util_gpu"])
    figure = Figure(figsize=(9, 3.5), layout="constrained")
    axes = figure.subplots()
    if gpu.empty:
        reason = part.runs["gpu_reason"].dropna()
        why = reason.iloc[-1] if len(reason) else "no GpuMonitor readings"
        return _empty(figure, axes, f"No GPU readings: {why}"[:120])
    start = gpu["time"].min()
    for (worker, device), readings in gpu.groupby(["worker", "gpu"]):
        readings = readings.sort_values("time")
        axes.plot(
            readings["time"] - start, readings["util_gpu"], label=f"worker {worker} GPU {device}"
        )
    axes.set(
        title=f"GPU utilization: run {run}",
        xlabel="seconds since the first reading",
        ylabel="% of time a kernel ran",
        ylim=(0, 105),
    )
    axes.legend(fontsize="small")
    return figure


def scaling(report) -> Figure:
    """Throughput against replicas: measured and ideal (linear from the smallest run),
    with the scaling efficiency of each point."""
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


def step_time(report, run: str | None = None) -> Figure:
    """Host wall time of every step (warm-up calls left out)."""
    run, part = _run(report, run)
    steps = part.steps[~part.steps["warmup"].fillna(False).astype(bool)].dropna(subset=["step_ms"])
    figure = Figure(figsize=(8, 3), layout="constrained")
    axes = figure.subplots()
    if steps.empty:
        return _empty(figure, axes, "No timed steps (add kdt.StepTimer).")
    for worker, rows in steps.groupby("worker"):
        axes.plot(rows["step"], rows["step_ms"], label=f"worker {worker}", linewidth=0.8)
    axes.set(title=f"Wall time per step: run {run}", xlabel="global step", ylabel="ms")
    if steps["worker"].nunique() > 1:
        axes.legend()
    return figure


def worker_wait(report, run: str | None = None) -> Figure:
    """Per step, how long each worker waited for the last worker to enter the step
    (multi-worker runs; clocks aligned at the step ends, see ``Report.workers``)."""
    run, part = _run(report, run)
    steps = part.steps.dropna(subset=["worker_wait_ms"])
    figure = Figure(figsize=(8, 3), layout="constrained")
    axes = figure.subplots()
    if steps.empty:
        return _empty(figure, axes, "No cross-worker waits (needs 2+ workers with StepTimer).")
    for worker, rows in steps.groupby("worker"):
        axes.plot(rows["step"], rows["worker_wait_ms"], label=f"worker {worker}", linewidth=0.8)
    axes.set(title=f"Waiting for other workers: run {run}", xlabel="global step", ylabel="ms")
    axes.legend()
    return figure
