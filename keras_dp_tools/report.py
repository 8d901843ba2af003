"""Report: the records of one or many runs as pandas DataFrames.

Pure analysis: reads the JSON Lines records (see ``docs/records.md``) and needs no
TensorFlow, so it works in a notebook on a machine that never trained anything.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import pandas as pd

from keras_dp_tools.records import find_record_files, read_records

RUN_COLUMNS = [
    "run",
    "worker",
    "workers",
    "time",
    "hostname",
    "pid",
    "strategy",
    "replicas",
    "devices",
    "global_batch",
    "steps_per_execution",
    "keras_package",
    "keras_version",
    "tf_version",
    "python_version",
    "keras_dp_tools_version",
    "source",
]
STEP_COLUMNS = [
    "run",
    "worker",
    "epoch",
    "step",
    "steps",
    "replicas",
    "global_batch",
    "step_ms",
    "examples_per_s",
    "warmup",
    "time",
]
# Columns that must be complete in every step record.
_STEP_INTEGERS = ("worker", "epoch", "step", "steps")


class Report:
    """Records of one or more runs, loaded with ``Report.load``.

    Attributes:
        runs: one row per run and worker, from the run headers (strategy, replicas,
            devices, global batch, versions, host, start ``time`` in Unix seconds).
        steps: one row per worker and recorded train-function call; ``step`` is the
            global step (``optimizer.iterations``) it started at and ``steps`` how
            many steps it covers (more than 1 with ``steps_per_execution``);
            ``step_ms`` is wall time per step. ``warmup`` rows include tracing and
            compilation.

    Example:

    ```python
    import keras_dp_tools as kdt

    report = kdt.Report.load("runs/demo-20261129-093000")
    print(report.summary())
    report.steps.plot(x="step", y="step_ms")
    ```
    """

    def __init__(self, runs: pd.DataFrame, steps: pd.DataFrame):
        self.runs = runs
        self.steps = steps

    def __repr__(self) -> str:
        return (
            f"Report(runs={self.runs['run'].nunique()}, workers={len(self.runs)}, "
            f"step_records={len(self.steps)})"
        )

    @classmethod
    def load(cls, sources: str | os.PathLike | Iterable[str | os.PathLike]) -> Report:
        """Loads every records file under one or more log dirs (searched recursively)
        or ``.jsonl`` paths, merging runs and workers.

        Raises:
            FileNotFoundError: a path does not exist, or holds no records.
        """
        frames = []
        for path in find_record_files(sources):
            frame = read_records(path)
            frame["source"] = str(path)
            frames.append(frame)
        records = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
        return cls(_runs(records), _steps(records))

    def summary(self) -> pd.DataFrame:
        """One row per run: replicas, global batch, steps and step-time statistics.

        Warm-up calls (tracing, compilation) are left out of the statistics.
        ``examples_per_s`` is the median over steps.
        """
        steps = self.steps[~self.steps["warmup"].fillna(False).astype(bool)]
        grouped = steps.groupby("run", sort=False)
        summary = pd.DataFrame(
            {
                "workers": grouped["worker"].nunique(),
                "replicas": grouped["replicas"].first(),
                "global_batch": grouped["global_batch"].first(),
                "steps": grouped["steps"].sum(),
                "median_step_ms": grouped["step_ms"].median(),
                "p90_step_ms": grouped["step_ms"].quantile(0.9),
                "examples_per_s": grouped["examples_per_s"].median(),
            }
        )
        started = self.runs.groupby("run")["time"].min()
        summary.insert(0, "start", pd.to_datetime(started.reindex(summary.index), unit="s"))
        return summary.sort_values("start")


def _runs(records: pd.DataFrame) -> pd.DataFrame:
    headers = records[records["type"] == "header"]
    runs = headers.reindex(columns=RUN_COLUMNS).drop_duplicates(["run", "worker"], keep="last")
    return runs.sort_values(["time", "worker"]).reset_index(drop=True)


def _steps(records: pd.DataFrame) -> pd.DataFrame:
    steps = records.loc[
        records["type"] == "step",
        [c for c in STEP_COLUMNS if c not in ("replicas", "global_batch")],
    ]
    headers = _runs(records)[["run", "worker", "replicas", "global_batch"]]
    steps = steps.merge(headers, on=["run", "worker"], how="left")
    for column in _STEP_INTEGERS:
        if not steps[column].hasnans:
            steps[column] = steps[column].astype("int64")
    steps = steps[STEP_COLUMNS].sort_values(["run", "worker", "step"], kind="stable")
    return steps.reset_index(drop=True)
