"""The advisor's finding about time outside the training steps (issue 36, cause 3).

Pure functions over ``analysis.fit_time.fit_time_frame``'s rows (no TensorFlow). A fit
whose steps are fast can still be slow: per-epoch set-up, validation, callbacks between
steps and the first step's tracing add up, and more replicas shorten none of them (a
242-row dataset with 2 steps per epoch spent almost all of ``fit`` between steps).

The finding fires when a quarter of the fit's wall time or more lies outside the steps
(``OUTSIDE_STEPS_SHARE_HIGH``). It names the largest part, gives what each part costs
per step, and the fix for that part. First-step tracing (a fixed cost per fit that a
longer run amortises) and our profiler stopping its windows are not the training's to
change: when the time outside steps reaches the threshold only with them, the finding
is ``info`` about the larger of the two, else ``warning`` with the fix of the largest
other part.
"""

from __future__ import annotations

import pandas as pd

from keras_dp_tools.analysis.fit_time import OUTSIDE_PARTS
from keras_dp_tools.common.findings import Advice, Finding

# Time outside the steps over the fit's wall time, from which the finding fires. At a
# quarter, removing it speeds fit up by a third (1 / 0.75): as much as the advisor's
# per-step findings point at (input 10%, all-reduce 20% of a step); below it, what
# happens inside the steps dominates and is where the other findings look.
OUTSIDE_STEPS_SHARE_HIGH = 0.25
# An epoch of fewer steps than this pays its set-up often enough to advise larger epochs.
FEW_STEPS_PER_EPOCH = 100

_NAMES = {
    "validation_s": "validation",
    "epoch_setup_s": "epoch set-up and ends (iterator, epoch-end callbacks)",
    "between_steps_s": "host work between steps (per-batch callbacks)",
    "first_step_s": "first-step tracing and compilation",
    "profiler_stop_s": "our profiler stopping its windows",
}
# Parts outside the steps that the training's set-up does not cause.
_NOT_THE_TRAININGS = ("first_step_s", "profiler_stop_s")
_FIX_TRACING = (
    "Nothing to change in the model: the first call of the train function traces and "
    "compiles it once per fit. A longer run amortises it; measure over more steps "
    "(or call fit once and keep training in it rather than fitting in short pieces)."
)
_FIX_PROFILER = (
    "Nothing to change in the training: DataParallelProfiler writes each window's trace "
    "when it stops (a few windows per run), which steady training does not pay. In a "
    "short run, take fewer windows: DataParallelProfiler(max_windows=1), or start it "
    "later (start_step=...)."
)
_FIX_VALIDATION = (
    "Validate less often or on fewer batches: fit(..., validation_freq=N) validates "
    "every N epochs, validation_steps=K on K batches."
)
_FIX_CALLBACKS = (
    "Make per-batch work cheaper or rarer: fewer callbacks with on_train_batch_* hooks, "
    "TensorBoard(update_freq='epoch'), fit(verbose=2) instead of a progress bar"
)
_SPE_TF_KERAS = ", or run several steps per call: compile(steps_per_execution=N)."
# Keras 3 under MirroredStrategy fails fit with steps_per_execution > 1
# (keras-team/keras#19246; tests/test_step_timer.py), so it is not advised there.
_SPE_KERAS3 = (
    ". (compile(steps_per_execution=N) would also help, but Keras 3 fails fit with it "
    "under MirroredStrategy, keras-team/keras#19246: with tf_keras it works.)"
)


def fit_time_findings(fit_time: pd.DataFrame, runs: pd.DataFrame | None = None) -> list[Finding]:
    """The ``time-outside-steps`` finding of each run whose fits spent a large share of
    their wall time outside the training steps.

    Args:
        fit_time: ``analysis.fit_time.fit_time_frame``'s rows; only finished fits count,
            summed over the run's fits and workers.
        runs: optional run headers (``Report.runs``: ``run``, ``keras_package``,
            ``replicas``), to choose a fix that works with the run's Keras.

    Returns:
        At most one ``Finding`` per run, with ``explains_ms_per_step``: the ms per step
        of the parts its fix addresses (tracing or the profiler's stops alone for the
        ``info`` finding; the training's parts for the ``warning``).

    Example:

    ```python
    import pandas as pd
    from keras_dp_tools.analysis.fit_time_advice import fit_time_findings

    fit_time = pd.DataFrame([{
        "run": "r", "worker": 0, "status": "finished", "fit_s": 10.0,
        "in_steps_s": 4.0, "outside_steps_s": 6.0, "validation_s": 5.0,
        "epoch_setup_s": 0.5, "between_steps_s": 0.2, "first_step_s": 0.3,
        "steps": 200, "epochs": 2, "validations": 2,
    }])
    print(fit_time_findings(fit_time)[0])  # validation: 25 ms of each step
    ```
    """
    if fit_time.empty:
        return []
    done = fit_time[fit_time["status"] == "finished"]
    findings = []
    for run, rows in done.groupby("run", sort=False):
        finding = _finding(rows, _keras3_mirrored(runs, run))
        if finding is not None:
            findings.append(finding)
    return findings


def _keras3_mirrored(runs: pd.DataFrame | None, run) -> bool | None:
    """Whether the run fit a Keras 3 model over several replicas; None if unknown."""
    if runs is None or runs.empty or "keras_package" not in runs:
        return None
    header = runs[runs["run"] == run]
    if header.empty:
        return None
    replicas = pd.to_numeric(header.get("replicas"), errors="coerce").max()
    return bool((header["keras_package"] == "keras").any() and replicas > 1)


def _finding(rows: pd.DataFrame, keras3_mirrored: bool | None) -> Finding | None:
    fit_s = float(rows["fit_s"].sum())
    outside_s = float(rows["outside_steps_s"].sum())
    steps = float(rows["steps"].sum())
    if not fit_s > 0 or not steps > 0 or outside_s / fit_s < OUTSIDE_STEPS_SHARE_HIGH:
        return None
    parts = {name: float(rows[name].fillna(0.0).sum()) for name in OUTSIDE_PARTS}
    fixed = {name: parts[name] for name in _NOT_THE_TRAININGS}
    actionable = {name: s for name, s in parts.items() if name not in _NOT_THE_TRAININGS}
    if (outside_s - sum(fixed.values())) / fit_s >= OUTSIDE_STEPS_SHARE_HIGH:
        severity, largest = "warning", max(actionable, key=actionable.get)
        explained_s = outside_s - sum(fixed.values())
    else:
        severity, largest = "info", max(fixed, key=fixed.get)
        explained_s = fixed[largest]
    ms_per_step = 1000.0 / steps
    shares = ", ".join(
        f"{_NAMES[name].split(' (')[0]} {seconds:.2f} s ({seconds * ms_per_step:.1f} ms/step)"
        for name, seconds in sorted(parts.items(), key=lambda item: -item[1])
    )
    calls = int(rows.groupby("worker").size().max())
    workers = rows["worker"].nunique()
    where = f"{calls} fit call{'s' if calls > 1 else ''}"
    where += f" on {workers} workers" if workers > 1 else ""
    evidence = (
        f"{outside_s / fit_s:.0%} of {fit_s:.2f} s in fit ({where}) lies outside the steps: "
        f"{outside_s:.2f} s, {outside_s * ms_per_step:.1f} ms per step over "
        f"{steps:.0f} steps, whose own time is "
        f"{float(rows['in_steps_s'].sum()) * ms_per_step:.1f} ms per step. Parts: {shares}. "
        f"Largest{' that training can change' if severity == 'warning' else ''}: "
        f"{_NAMES[largest]}."
    )
    title = f"{outside_s / fit_s:.0%} of fit's time is outside the training steps"
    return Advice(
        severity,
        title,
        evidence,
        _fix(largest, rows, keras3_mirrored),
        code="time-outside-steps",
        explains_ms_per_step=explained_s * ms_per_step,
    )


def _fix(largest: str, rows: pd.DataFrame, keras3_mirrored: bool | None) -> str:
    if largest == "first_step_s":
        return _FIX_TRACING
    if largest == "profiler_stop_s":
        return _FIX_PROFILER
    if largest == "validation_s":
        validations = float(rows["validations"].sum())
        each = float(rows["validation_s"].sum()) / validations if validations else float("nan")
        return f"{_FIX_VALIDATION} (Each of the {validations:.0f} validations took {each:.2f} s.)"
    if largest == "between_steps_s":
        return _FIX_CALLBACKS + (_SPE_KERAS3 if keras3_mirrored else _SPE_TF_KERAS)
    epochs = float(rows["epochs"].sum())
    per_epoch = float(rows["steps"].sum()) / epochs if epochs else float("nan")
    start_s, end_s = (_sum(rows, name) for name in ("epoch_start_s", "epoch_end_s"))
    larger_epochs = (
        "pay the per-epoch cost less often with fewer, larger epochs (repeat the dataset "
        "and give fit(steps_per_epoch=...) more steps, or fewer epochs over more data)"
    )
    cheaper_ends = (
        "keep on_epoch_end callbacks cheap or run them every few epochs "
        "(TensorBoard(histogram_freq=0 or N), checkpoints every N epochs, custom "
        "evaluation less often)"
    )
    # The larger of the two named parts leads (where an epoch's time went).
    if end_s > start_s:
        fix = (
            f"Epochs spent {end_s:.2f} s ending, {start_s:.2f} s starting: {cheaper_ends}; "
            f"and {larger_epochs}."
        )
    else:
        fix = (
            f"Epochs spent {start_s:.2f} s starting (creating each epoch's iterator), "
            f"{end_s:.2f} s ending: {larger_epochs}; and {cheaper_ends}."
        )
    if per_epoch < FEW_STEPS_PER_EPOCH:
        fix = f"Each epoch has only {per_epoch:.0f} steps. " + fix
    return fix


def _sum(rows: pd.DataFrame, name: str) -> float:
    """A column's total over the rows; 0 where the frame lacks it (older callers)."""
    return float(rows[name].fillna(0.0).sum()) if name in rows else 0.0
