"""The advisor's finding about a custom training loop whose ``strategy.run`` ran eagerly.

Pure functions over the record frames (no TensorFlow). ``kdt.TrainingLoop`` writes a
``training_loop`` record saying how the steps called ``strategy.run``: outside any
``tf.function`` (``step_function`` ``eager``, or ``run_functions_eagerly`` when
``tf.config.run_functions_eagerly(True)`` made a ``tf.function`` run eagerly),
MirroredStrategy runs the replica function on one replica after the other (a thread
per replica, taking turns), so more devices make the step no faster, often slower: the
public threads' "parallel GPUs working like serial". TensorFlow only logs a warning
(the first five times). This is an error with one fix: wrap the distributed step in
``tf.function``.
"""

from __future__ import annotations

import pandas as pd

from keras_dp_tools.common.findings import Advice, Finding

CODE = "eager-strategy-run"
EAGER_MODES = ("eager", "run_functions_eagerly")

FIX = (
    "Wrap the distributed step in tf.function: `@tf.function` on "
    "`def train_step(x, y): return strategy.run(replica_step, args=(x, y))`, and call "
    "train_step from the Python loop. The replicas then run in parallel in one graph."
)
FIX_RUN_EAGERLY = (
    "Turn off tf.config.run_functions_eagerly(True) (a debugging switch; it also runs "
    "your @tf.function step eagerly): call tf.config.run_functions_eagerly(False), or "
    "remove the call, before training."
)


def eager_loop_findings(loops: pd.DataFrame | None, steps: pd.DataFrame | None = None):
    """An error for each run whose custom training loop called ``strategy.run``
    eagerly (``error`` with more than one replica, ``warning`` with one: eager steps
    are slow, but nothing runs in turn); none for a loop that ran it in a
    ``tf.function``, or where no ``training_loop`` record was written (``fit``).

    Args:
        loops: the ``training_loop`` records (one row per record, as
            ``analysis.record_tables.records_by_type`` reads them; the latest record of each
            run and worker counts), or None.
        steps: ``Report.steps`` (``run``, ``worker``, ``step_ms``, ``warmup``, and
            ``profiled`` if known), for the step time in the evidence; optional.

    Returns:
        A list of ``Advice`` (code ``eager-strategy-run``), one per run, or empty.

    Example:

    ```python
    import pandas as pd
    from keras_dp_tools.analysis.loop_advice import eager_loop_findings

    loops = pd.DataFrame([{"run": "r1", "worker": 0, "time": 1.0, "step_function": "eager",
                           "steps": 100, "eager_steps": 100, "first_eager_step": 0,
                           "replicas": 4}])
    print(eager_loop_findings(loops)[0])
    ```
    """
    if loops is None or loops.empty or "step_function" not in loops:
        return []
    latest = _latest(loops)
    eager = latest[latest["step_function"].isin(EAGER_MODES)]
    findings: list[Finding] = []
    for run, records in eager.groupby("run", sort=False):
        findings.append(_finding(run, records, steps))
    return findings


def _latest(loops: pd.DataFrame) -> pd.DataFrame:
    """Each (run, worker)'s last record: the loop rewrites its totals at the end."""
    keys = [name for name in ("run", "worker") if name in loops]
    ordered = loops.sort_values("time", kind="stable") if "time" in loops else loops
    return ordered.drop_duplicates(keys, keep="last") if keys else ordered.tail(1)


def _finding(run, records: pd.DataFrame, steps: pd.DataFrame | None) -> Advice:
    record = records.iloc[0]
    replicas = _int(record.get("replicas")) or 1
    forced = (records["step_function"] == "run_functions_eagerly").any()
    eager_steps = _int(record.get("eager_steps"))
    total = _int(record.get("steps"))
    parts = []
    if eager_steps is not None and total:
        first = _int(record.get("first_eager_step"))
        since = f" from step {first}" if first is not None else ""
        parts.append(
            f"{eager_steps} of {total} steps called strategy.run outside any tf.function{since}"
        )
    else:
        parts.append("the steps called strategy.run outside any tf.function")
    if forced:
        parts[-1] += " (tf.config.run_functions_eagerly(True) was on)"
    if replicas > 1:
        parts.append(
            f"MirroredStrategy then runs its {replicas} replicas one after another, not in parallel"
        )
    median, timed, note = _median_step_ms(steps, run, records)
    if median is not None:
        parts.append(f"median step {median:.1f} ms over {timed} timed steps{note}")
    if len(records) > 1:
        workers = ", ".join(str(_int(w)) for w in records["worker"])
        parts.append(f"workers {workers}")
    severity = "error" if replicas > 1 else "warning"
    title = (
        f"The replicas run one after another: strategy.run is called eagerly ({replicas} replicas)"
        if replicas > 1
        else "strategy.run is called eagerly"
    )
    return Advice(
        severity, title, "; ".join(parts) + ".", FIX_RUN_EAGERLY if forced else FIX, code=CODE
    )


def _median_step_ms(steps: pd.DataFrame | None, run, records: pd.DataFrame):
    """(median step_ms, steps timed, note) of the run's workers in ``records``: steady
    steps (no warm-up, not profiled), else, in a short run, the profiled ones with a
    note that says so; (None, 0, "") when there are none."""
    if steps is None or steps.empty or "step_ms" not in steps or "run" not in steps:
        return None, 0, ""
    mine = steps[steps["run"] == run]
    if "worker" in mine and "worker" in records:
        mine = mine[mine["worker"].isin(records["worker"].tolist())]
    if "warmup" in mine:
        mine = mine[~mine["warmup"].fillna(False).astype(bool)]
    note = ""
    if "profiled" in mine:
        profiled = mine["profiled"].fillna(False).astype(bool)
        if (~profiled & mine["step_ms"].notna()).any():
            mine = mine[~profiled]
        else:
            note = ", all profiled (the profiler slows them)"
    times = mine["step_ms"].dropna()
    if times.empty:
        return None, 0, ""
    return float(times.median()), int(times.size), note


def _int(value) -> int | None:
    try:
        return None if value is None or pd.isna(value) else int(value)
    except (TypeError, ValueError):
        return None
