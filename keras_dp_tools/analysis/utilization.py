"""GPU utilization aligned to steps and epochs: pure functions over sample and step frames.

A reading is what the device did *since the previous reading* (NVML's utilization is a
share of its last sample period), so the signal is piecewise constant: reading ``k``
holds on ``(t[k-1], t[k]]``. The mean over a step is that signal integrated over the
step's interval and divided by its length, exact even when steps are much shorter than
the sampling interval.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from keras_dp_tools.common.findings import Advice, Finding

# Set by the monitor's GPM readings; compared with NVML's util_gpu by misleading_utilization.
MISLEADING_RATIO = 0.5


def interval_means(times, values, starts, ends) -> np.ndarray:
    """Mean of the piecewise-constant signal (``values[k]`` on ``(times[k-1], times[k]]``)
    over each ``[starts[i], ends[i]]``, clipped to the covered span; NaN where an
    interval lies outside it. ``times`` must be sorted."""
    times = np.asarray(times, dtype=float)
    values = np.asarray(values, dtype=float)
    starts = np.asarray(starts, dtype=float)
    ends = np.asarray(ends, dtype=float)
    if len(times) < 2:
        return np.full(len(starts), np.nan)
    integral = np.concatenate([[0.0], np.cumsum(values[1:] * np.diff(times))])

    def integral_at(x):
        k = np.clip(np.searchsorted(times, x, side="left"), 1, len(times) - 1)
        return integral[k - 1] + values[k] * (x - times[k - 1])

    lower = np.clip(starts, times[0], times[-1])
    upper = np.clip(ends, times[0], times[-1])
    covered = upper > lower
    means = np.full(len(starts), np.nan)
    means[covered] = (integral_at(upper[covered]) - integral_at(lower[covered])) / (
        upper[covered] - lower[covered]
    )
    return means


def _utilization_series(samples: pd.DataFrame) -> pd.DataFrame:
    """Per run, worker and GPU, the densest utilization series: the driver's buffered
    samples where the reader got them, else the polled readings."""
    series = samples.dropna(subset=["util_gpu"])
    if series.empty:
        return series
    buffered = (
        series["sampling"]
        .eq("buffer")
        .groupby([series["run"], series["worker"], series["gpu"]])
        .transform("any")
    )
    keep = series["sampling"].eq("buffer") | ~buffered
    return series[keep].sort_values("time")


def step_gpu_utilization(samples: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Mean ``util_gpu`` of each GPU over each step.

    Args:
        samples: ``run, worker, gpu, time, sampling, util_gpu`` (``Report.gpu``).
        steps: ``run, worker, step, time, step_ms, steps`` (``Report.steps``); a step
            lasts ``step_ms * steps`` ms from ``time``.

    Returns:
        ``run, worker, step, gpu, gpu_util``, one row per step and GPU with readings.
    """
    columns = ["run", "worker", "step", "gpu", "gpu_util"]
    series = _utilization_series(samples)
    if series.empty or steps.empty:
        return pd.DataFrame(columns=columns)
    frames = []
    durations = steps["step_ms"].astype(float) * steps["steps"].fillna(1).astype(float) / 1e3
    steps = steps.assign(end=steps["time"].astype(float) + durations)
    for (run, worker, gpu), readings in series.groupby(["run", "worker", "gpu"]):
        mine = steps[(steps["run"] == run) & (steps["worker"] == worker)]
        means = interval_means(readings["time"], readings["util_gpu"], mine["time"], mine["end"])
        frames.append(
            pd.DataFrame(
                {
                    "run": run,
                    "worker": worker,
                    "step": mine["step"].to_numpy(),
                    "gpu": gpu,
                    "gpu_util": means,
                }
            )
        )
    return pd.concat(frames, ignore_index=True).dropna(subset=["gpu_util"])[columns]


def epoch_gpu_summary(samples: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Per run, worker, epoch and GPU: mean utilization over the epoch's steps, and the
    epoch's mean SM activity, mean power and peak memory from the polled readings."""
    per_step = step_gpu_utilization(samples, steps)
    columns = ["run", "worker", "epoch", "gpu", "gpu_util", "sm_activity", "power_w", "mem_used_gb"]
    if per_step.empty:
        return pd.DataFrame(columns=columns)
    epochs = steps[["run", "worker", "step", "epoch", "time", "step_ms", "steps"]]
    per_step = per_step.merge(epochs, on=["run", "worker", "step"])
    bounds = per_step.groupby(["run", "worker", "epoch"]).agg(
        start=("time", "min"), end=("time", "max")
    )
    summary = per_step.groupby(["run", "worker", "epoch", "gpu"], as_index=False)["gpu_util"].mean()
    polled = samples[samples["sampling"] == "poll"]
    extra = []
    for row in summary.itertuples():
        start, end = bounds.loc[(row.run, row.worker, row.epoch)]
        window = polled[
            (polled["run"] == row.run)
            & (polled["worker"] == row.worker)
            & (polled["gpu"] == row.gpu)
            & polled["time"].between(start, end)
        ]
        extra.append(
            {
                "sm_activity": window.get("sm_activity", pd.Series(dtype=float)).mean(),
                "power_w": window.get("power_w", pd.Series(dtype=float)).mean(),
                "mem_used_gb": window.get("mem_used_gb", pd.Series(dtype=float)).max(),
            }
        )
    return pd.concat([summary, pd.DataFrame(extra, index=summary.index)], axis=1)[columns]


def misleading_utilization(samples: pd.DataFrame) -> list[Finding]:
    """Readings that mislead: NVML utilization high while GPM SM activity (the share of
    SMs actually busy) is much lower, per run, worker and GPU (info findings)."""
    if "sm_activity" not in samples or samples["sm_activity"].isna().all():
        return []
    findings = []
    polled = samples[samples["sampling"] == "poll"]
    for (run, worker, gpu), readings in polled.groupby(["run", "worker", "gpu"]):
        util, activity = readings["util_gpu"].mean(), readings["sm_activity"].mean()
        if (
            pd.notna(util)
            and pd.notna(activity)
            and util >= 30
            and activity < MISLEADING_RATIO * util
        ):
            findings.append(
                Advice(
                    "info",
                    "GPU utilization is possibly misleading",
                    f"run {run}, worker {worker}, GPU {gpu}: NVML utilization {util:.0f}% but "
                    f"SM activity {activity:.0f}%: kernels ran most of the time on few SMs. "
                    "Utilization is possibly misleading; look at larger batches or fused "
                    "kernels.",
                    "Judge by SM activity (GPM) and step time rather than NVML utilization.",
                    code="misleading-utilization",
                )
            )
    return findings


def utilization_findings(samples: pd.DataFrame) -> list[str]:
    """The notes of ``misleading_utilization``, as text (``Report.gpu_findings()``)."""
    return [finding.evidence for finding in misleading_utilization(samples)]
