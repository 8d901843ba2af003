"""``what_if``: the step time of a measured run under other conditions, from its breakdown.

The model (docs/tuning.md has its derivation and its measured error):

* compute per replica scales with the per-replica batch: ``compute_ms * b' / b``; when
  the replicas are logical devices of one CPU they share its cores, so compute scales
  with the examples per worker instead: ``compute_ms * (n' b') / (n b)``;
* the all-reduce of ``S`` gradient bytes over ``n`` replicas on a ring whose slowest
  link carries ``B`` bytes/s takes ``latency + 2(n-1)/n * S / B``; ``latency`` is
  fitted from the run as what the measured all-reduce took beyond that ring transfer
  (with the link's bandwidth when you give it, else with the bus bandwidth the
  breakdown measured, in which case the latency is the measured sync wait), and
  grows with the ring's ``n - 1`` hops;
* the all-reduce time the run hid behind compute stays hidden (up to the new
  compute time), and the rest of the step (input, host overhead) stays as measured.

Pure pandas over ``Report`` DataFrames: no TensorFlow.
"""

from __future__ import annotations

import os

import pandas as pd

from keras_dp_tools.analysis.job_advice import records_findings
from keras_dp_tools.analysis.run_frames import RunFrames, load_run_frames
from keras_dp_tools.analysis.step_parts import StepParts, step_parts
from keras_dp_tools.common.validation import require_positive_int, require_positive_number
from keras_dp_tools.common.warn import warn

WHAT_IF_COLUMNS = [
    "run",
    "replicas",
    "workers",
    "per_replica_batch",
    "bandwidth_gbps",
    "measured_step_ms",
    "step_ms",
    "compute_ms",
    "allreduce_ms",
    "exposed_allreduce_ms",
    "other_ms",
    "examples_per_s",
    "scaling_efficiency",
    "limited_by",
]


def ring_factor(replicas: int) -> float:
    """Bytes through each rank's link per byte all-reduced on a ring: 2(n-1)/n."""
    return 2 * (replicas - 1) / replicas


def _measured(parts: StepParts) -> dict:
    """A run's medians: unprofiled step time (of every step), profiled breakdown (of the
    rows with one), sizes."""
    steps, profiled = parts.all, parts.profiled
    warm = profiled[~profiled["warmup"].fillna(False).astype(bool)]
    profiled = warm.dropna(subset=["compute_ms", "allreduce_ms"])
    run = steps["run"].iloc[0]
    if profiled.empty:
        raise ValueError(
            f"Run {run!r} has no profiled steps with a compute / all-reduce breakdown: "
            "record it with kdt.DataParallelProfiler (or kdt.callbacks(...)) first."
        )
    medians = profiled[
        ["compute_ms", "allreduce_ms", "exposed_allreduce_ms", "sync_wait_ms", "transfer_ms"]
    ].median()
    replicas = int(steps["replicas"].dropna().iloc[0])
    global_batch = steps["global_batch"].dropna()
    allreduce_bytes = profiled["allreduce_bytes"].dropna()
    if replicas < 2 or allreduce_bytes.empty:
        raise ValueError(
            f"Run {run!r} has {replicas} replica(s) and "
            f"{'no' if allreduce_bytes.empty else 'known'} gradient bytes: predicting "
            "all-reduce times needs a run with at least 2 replicas and its allreduce_bytes."
        )
    return {
        "run": run,
        "replicas": replicas,
        "workers": int(steps["worker"].nunique()),
        "global_batch": int(global_batch.iloc[0]) if len(global_batch) else None,
        "step_ms": float(_measured_step_ms(parts)),
        "allreduce_bytes": float(allreduce_bytes.median()),
        **{name: float(value) for name, value in medians.items()},
    }


def _measured_step_ms(parts: StepParts) -> float:
    """The run's median step time as the summary reads it: the job's step time in a
    multi-worker run (a worker's own time in the train call is short on the worker the
    others wait for); the steps a profiler disturbed only where no other was measured."""
    measured = parts.measured()  # grouped once per parts (the summary's too)
    if measured.empty:
        measured = parts.measured(disturbed=True)
    return measured["step_ms"].median()


def _shares_cpu(runs, run_id) -> bool:
    """Whether the run's replicas were logical devices of the workers' CPUs."""
    if runs is None or "devices" not in runs or runs.empty:
        return False
    devices = runs.loc[runs["run"] == run_id, "devices"].dropna()
    names = [str(name) for listed in devices for name in listed]
    return bool(names) and all("CPU" in name.upper() for name in names)


def _predict(run: dict, bandwidth_gbps, measured_bandwidth_gbps, replicas, workers, batch):
    n = run["replicas"]
    per_worker = n // run["workers"] if n % run["workers"] == 0 else None
    if workers is not None:
        if per_worker is None:
            raise ValueError(f"Run {run['run']!r}: {n} replicas do not split evenly over workers.")
        n_new = workers * per_worker
    else:
        n_new = replicas or n
    b = run["global_batch"] / n if run["global_batch"] else None
    b_new = batch or b
    scale = b_new / b if (b and b_new) else 1.0
    size = run["allreduce_bytes"]
    # Bytes/s of the ring's slowest link in the measured run, and the latency beyond it.
    if measured_bandwidth_gbps:
        link = measured_bandwidth_gbps * 1e9
        latency = max(0.0, run["allreduce_ms"] - ring_factor(n) * size / link * 1e3)
    else:
        link = ring_factor(n) * size / (run["transfer_ms"] / 1e3) if run["transfer_ms"] else None
        latency = run["allreduce_ms"] - run["transfer_ms"]
    link_new = bandwidth_gbps * 1e9 if bandwidth_gbps else link
    if link_new is None:
        raise ValueError(f"Run {run['run']!r} measured no transfer time: give bandwidth_gbps.")
    compute = run["compute_ms"] * scale
    if run["shares_cpu"]:  # the same cores run every replica of a worker
        workers_new = workers or run["workers"]
        compute *= (n_new / workers_new) / (n / run["workers"])
    hidden = min(run["allreduce_ms"] - run["exposed_allreduce_ms"], compute)
    other = max(0.0, run["step_ms"] - run["compute_ms"] - run["exposed_allreduce_ms"])
    if n_new > 1:
        latency_new = latency * (n_new - 1) / (n - 1)
        transfer_new = ring_factor(n_new) * size / link_new * 1e3
    else:
        latency_new = transfer_new = 0.0
    allreduce = latency_new + transfer_new
    exposed = max(0.0, allreduce - hidden)
    step = compute + exposed + other
    examples_per_s = n_new * b_new / step * 1e3 if b_new else None
    parts = {
        "compute": compute,
        "the link (all-reduce transfer)": max(0.0, transfer_new - hidden),
        "all-reduce latency and waiting": min(latency_new, exposed),
        "input and host overhead": other,
    }
    limit, limit_ms = max(parts.items(), key=lambda item: item[1])
    sentence = f"{limit}: {limit_ms:.1f} of {step:.1f} ms per step ({limit_ms / step:.0%})"
    if run["shares_cpu"] and limit == "compute":
        sentence += "; the replicas share one CPU's cores, so more replicas add compute"
    if limit.startswith("the link"):
        sentence += (
            f"; {ring_factor(n_new) * size / 1e6:.2f} MB per replica at {link_new / 1e9:.4g} GB/s"
        )
    return {
        "run": run["run"],
        "replicas": n_new,
        "workers": workers or run["workers"],
        "per_replica_batch": b_new,
        "bandwidth_gbps": link_new / 1e9,
        "measured_step_ms": run["step_ms"],
        "step_ms": step,
        "compute_ms": compute,
        "allreduce_ms": allreduce,
        "exposed_allreduce_ms": exposed,
        "other_ms": other,
        "examples_per_s": examples_per_s,
        "scaling_efficiency": (run["compute_ms"] * scale + other) / step,
        "limited_by": sentence,
    }


def what_if(
    report,
    *,
    bandwidth_gbps: float | None = None,
    replicas: int | None = None,
    workers: int | None = None,
    per_replica_batch: int | None = None,
    measured_bandwidth_gbps: float | None = None,
) -> pd.DataFrame:
    """Predicts each measured run's step time on another link, replica count or batch.

    Example:

    ```python
    import keras_dp_tools as kdt

    report = kdt.Report.load("runs/two-workers-200mbit")
    # The run's link carried 200 Mbit/s = 0.025 GB/s; what would 100 Mbit/s give?
    table = kdt.what_if(report, bandwidth_gbps=0.0125, measured_bandwidth_gbps=0.025)
    print(table[["run", "measured_step_ms", "step_ms", "limited_by"]])
    ```

    Args:
        report: a ``kdt.Report`` whose runs have 2 or more replicas and a profiled
            window (``DataParallelProfiler``): its ``steps``, and its ``runs`` for the
            devices (logical CPU devices share cores). Runs without those are left
            out with a warning that says why (an error when no run has them). Or a
            log dir: loaded as ``kdt.Report.load(log_dir, merge_runs="detected")``,
            but merging only workers of one job recorded under separate run ids
            whose headers share a cluster fingerprint (older records without one
            stay apart: they could be two jobs at once), with a warning that says
            what was merged or left apart.
        bandwidth_gbps: the link to predict for, in GB/s (1e9 bytes/s, as
            ``busbw_gbps``; 1 Gbit/s is 0.125). None: the measured run's.
        replicas: total replicas to predict for (None: as measured).
        workers: workers to predict for, at the measured replicas per worker.
        per_replica_batch: examples per replica to predict for (None: as measured);
            compute time is taken as proportional to it.
        measured_bandwidth_gbps: the link the run was measured on, in GB/s, if known
            (the NIC's or interconnect's rate). With it, the latency term is what the
            all-reduce took beyond the ring transfer at that rate; without it, the
            breakdown's bus bandwidth stands for the link and the latency is the
            measured sync wait.

    Returns:
        One row per run (``WHAT_IF_COLUMNS``): predicted ``step_ms``, its parts,
        ``examples_per_s``, ``scaling_efficiency`` (one replica's step time over the
        predicted one, at the same per-replica batch) and ``limited_by``, a sentence
        naming the largest part of the predicted step.
    """
    for name, value in (
        ("bandwidth_gbps", bandwidth_gbps),
        ("measured_bandwidth_gbps", measured_bandwidth_gbps),
    ):
        if value is not None:
            require_positive_number(name, value)
    for name, value in (
        ("replicas", replicas),
        ("workers", workers),
        ("per_replica_batch", per_replica_batch),
    ):
        if value is not None:
            require_positive_int(name, value)
    if replicas is not None and workers is not None:
        raise ValueError(
            "Give replicas (total) or workers (at the measured replicas per worker), not both."
        )
    jobs_note = ""  # a log dir's runs merged, or kept apart though they look split
    if isinstance(report, (str, os.PathLike)):
        report, jobs_note = _load_log_dir(report)
    # The steps in parts: the breakdown's columns on the profiled rows only (the wide
    # frame of every step is not built).
    parts = report.step_parts if hasattr(report, "step_parts") else step_parts(report.steps)
    if not len(parts):
        raise ValueError("The report has no steps: load a log dir written by kdt callbacks.")
    runs = getattr(report, "runs", None)
    measured, unusable = [], []
    for run in parts.all["run"].drop_duplicates():
        try:
            measured.append(_measured(parts.for_run(run)))
        except ValueError as why:  # no breakdown, or one replica: say so, use the others
            unusable.append(str(why))
    if not measured:
        raise ValueError(" ".join([*unusable, jobs_note]).strip())
    if jobs_note:
        warn(f"what_if: {jobs_note}")
    if unusable:
        used = ", ".join(repr(run["run"]) for run in measured)
        warn(f"what_if predicts for run(s) {used} only. {' '.join(unusable)}")
    rows = [
        _predict(
            {**run, "shares_cpu": _shares_cpu(runs, run["run"])},
            bandwidth_gbps,
            measured_bandwidth_gbps,
            replicas,
            workers,
            per_replica_batch,
        )
        for run in measured
    ]
    return pd.DataFrame(rows, columns=WHAT_IF_COLUMNS)


def _load_log_dir(log_dir) -> tuple[RunFrames, str]:
    """The frames of a log dir, and what to tell about its jobs. Runs that look like
    one job's workers by their cluster fingerprint are merged (``analysis.jobs``):
    predicting a job needs its cross-worker waits. Runs that look so by their worker
    count alone (records without a fingerprint) could be two jobs at once: kept apart,
    with the split finding's advice."""
    from keras_dp_tools.records.reader import find_record_files

    files = ((path, 0) for path in find_record_files(log_dir))
    frames = load_run_frames(files, merge_runs="detected", detected_need_cluster=True)
    found = records_findings(frames.jobs)
    notes = [f"{item.message}." for item in found if item.code == "merged-runs"]
    notes += [
        f"{item.message}; recorded without a cluster fingerprint, they could be two jobs "
        "at once, so what_if predicts them apart. If they are one job: "
        "kdt.what_if(kdt.Report.load(log_dir, merge_runs='detected')). " + item.fix
        for item in found
        if item.code == "split-runs"
    ]
    return frames, " ".join(notes)
