"""The advisor: findings about a run, each with its evidence and a concrete fix.

Pure functions over a run's frames (``analysis.run_frames.RunFrames``): ``advise``
gathers the findings by topic (``breakdown_advice``: the profiled steps;
``host_advice``: GPUs, CPU, batching, step times, scaling; ``worker_advice``: the late
worker; ``step_cost_advice``: too little work per step, input that Python makes;
``fit_time_advice``: time outside the steps; ``kernel_advice``: kernels slower under
the strategy), ranked by ``rank_findings``: severity,
then the ms of each step a finding explains. Each finding is a
``keras_dp_tools.common.findings.Finding`` (made with ``Advice``: severity, title,
evidence, fix) with a ``code`` of its own.
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import pandas as pd

from keras_dp_tools.analysis.breakdown_advice import (
    communication_findings,
    embedding_findings,
    input_findings,
    other_time_findings,
    profiled_steps,
    unsynchronised_findings,
    waiting_findings,
)
from keras_dp_tools.analysis.fit_time_advice import fit_time_findings
from keras_dp_tools.analysis.host_advice import (
    batching_findings,
    cpu_findings,
    gpu_findings,
    scaling_findings,
    step_time_findings,
)
from keras_dp_tools.analysis.kernel_advice import kernel_findings
from keras_dp_tools.analysis.loop_advice import EAGER_MODES, eager_loop_findings
from keras_dp_tools.analysis.step_cost_advice import (
    LARGER_BATCH,
    python_input_findings,
    step_costs,
    work_findings,
)
from keras_dp_tools.analysis.what_if import what_if
from keras_dp_tools.analysis.worker_advice import late_worker_findings
from keras_dp_tools.common.findings import Finding

# Printed once above the findings, never ranked among them: replicas on logical devices
# of one CPU share its cores, so every time they measure includes that contention.
CAVEAT_CODES = ("cpu-saturated",)


def _run_advice(frames) -> list[Finding]:
    profiled = profiled_steps(frames)
    advice = unsynchronised_findings(profiled, frames)
    if not profiled.empty:
        advice += communication_findings(profiled) + embedding_findings(profiled, frames)
        advice += (
            waiting_findings(profiled, frames)
            + input_findings(profiled)
            + other_time_findings(profiled)
        )
    advice += _step_cost_findings(frames, profiled)
    advice += late_worker_findings(frames)
    advice += fit_time_findings(frames.fits, frames.runs)
    advice += eager_loop_findings(frames.loops, frames.step_parts.all)
    return (
        advice
        + gpu_findings(frames)
        + cpu_findings(frames)
        + batching_findings(frames)
        + step_time_findings(frames)
    )


def _step_cost_findings(frames, profiled: pd.DataFrame) -> list[Finding]:
    """Too little work per step, or input that Python makes, from one run's header; for
    a custom loop (``kdt.TrainingLoop``) the loop's form of the first, and nothing of it
    when the loop ran ``strategy.run`` eagerly (``eager-strategy-run`` says why)."""
    if frames.runs.empty:
        return []
    header = frames.runs.iloc[0]
    costs = step_costs(profiled) if not profiled.empty else None
    loops = frames.loops
    if loops["step_function"].isin(EAGER_MODES).any():
        return python_input_findings(header, costs)
    custom_loop = not loops.empty
    gain = _larger_batch_gain(frames, header) if costs else None
    return python_input_findings(header, costs) + work_findings(header, costs, custom_loop, gain)


def _larger_batch_gain(frames, header: pd.Series) -> float | None:
    """The throughput ``what_if`` predicts at ``LARGER_BATCH`` times the run's
    per-replica batch, over the measured one; None where it cannot predict (one
    replica, no gradient bytes, no global batch)."""
    batch, replicas = header.get("global_batch"), header.get("replicas")
    if pd.isna(batch) or not batch or pd.isna(replicas) or not replicas:
        return None
    per_replica = int(batch) // int(replicas)
    with warnings.catch_warnings():  # what_if warns the user of runs it leaves out
        warnings.simplefilter("ignore")
        try:
            table = what_if(frames, per_replica_batch=LARGER_BATCH * per_replica)
        except (ValueError, KeyError, ZeroDivisionError):
            return None
    if table.empty:
        return None
    row = table.iloc[0]
    return float(LARGER_BATCH * row["measured_step_ms"] / row["step_ms"])


def rank_findings(advice: list[Finding]) -> list[Finding]:
    """The findings in the order to act on them: the caveats first (``CAVEAT_CODES``,
    printed once above the findings), then by severity, and within a severity by the
    ms of each step a finding explains (``Finding.explains_ms_per_step``; unmeasured
    last). Stable: equals keep their order.

    Args:
        advice: findings of the advisor and of the jobs.

    Returns:
        A new list; its first finding that is not a caveat is the one to act on.
    """

    def key(item: Finding) -> tuple:
        explains = item.explains_ms_per_step
        return (
            item.code not in CAVEAT_CODES,
            -item.severity.level,
            -(explains if explains is not None and explains == explains else -1.0),
        )

    return sorted(advice, key=key)


def advise(frames, scaling: pd.DataFrame | None = None) -> list[Finding]:
    """The advisor's findings for the runs in ``frames``, worst first.

    With several runs, each run's findings say which run they are about.

    Args:
        frames: a ``RunFrames`` (``analysis.run_frames``).
        scaling: the runs by replica count (``summary.scaling_table``,
            ``Report.compare()``): adds the scaling finding.

    Returns:
        A list of ``Finding``, ranked (``rank_findings``; without the job findings:
        ``analysis.run_advice.advise_run`` adds them).

    Example:

    ```python
    from keras_dp_tools.analysis.advice import advise
    from keras_dp_tools.analysis.run_frames import load_run_frames

    for item in advise(load_run_frames([("runs/demo/keras_dp/worker-0.jsonl", 0)])):
        print(item)
    ```
    """
    runs = list(frames.runs["run"].drop_duplicates())
    if len(runs) <= 1:
        advice = _run_advice(frames)
    else:
        advice = []
        for run in runs:
            part = frames.for_run(run)
            replicas = part.runs["replicas"].max()
            where = f"run {run} ({replicas} replicas): "
            advice += [replace(item, evidence=where + item.evidence) for item in _run_advice(part)]
    advice += scaling_findings(frames, scaling)
    if len(runs) > 1:  # runs at several replica counts: the kernels' cost by replicas
        advice += kernel_findings(frames)
    return rank_findings(advice)


def advice_markdown(advice: list[Finding]) -> str:
    """The findings as a markdown list (TensorBoard's Text tab, HTML reports).

    Args:
        advice: findings (``run_advice.advise_run``).

    Returns:
        One line per finding, or a line saying nothing stands out.
    """
    if not advice:
        return "No findings: nothing stands out in the recorded numbers."
    return "\n".join(item.to_markdown() for item in advice)
