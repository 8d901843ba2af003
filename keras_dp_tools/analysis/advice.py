"""The advisor: findings about a run, each with its evidence and a concrete fix.

Pure functions over a run's frames (``analysis.run_frames.RunFrames``): ``advise``
gathers the findings by topic (``breakdown_advice``: the profiled steps;
``host_advice``: GPUs, CPU, batching, step times, scaling; ``worker_advice``: the late
worker). Each finding is a ``keras_dp_tools.common.findings.Finding`` (made with
``Advice``: severity, title, evidence, fix) with a ``code`` of its own.
"""

from __future__ import annotations

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
from keras_dp_tools.analysis.host_advice import (
    batching_findings,
    cpu_findings,
    gpu_findings,
    scaling_findings,
    step_time_findings,
)
from keras_dp_tools.analysis.worker_advice import late_worker_findings
from keras_dp_tools.common.findings import Finding
from keras_dp_tools.common.severity import Severity

# What replicas that share saturated CPU cores show as waits and gaps: contention for
# the cores, graded as what it is rather than as a problem of balance or of the host.
_CONTENTION_CODES = ("replica-wait", "replica-straggler", "other-time")


def _as_contention(finding: Finding) -> Finding:
    return replace(
        finding,
        severity=Severity.INFO,
        evidence=f"{finding.evidence} The CPU is saturated on this run, so this measures "
        "replicas competing for the same cores (see the CPU finding), not imbalance.",
    )


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
    advice += late_worker_findings(frames)
    cpu = cpu_findings(frames)
    if cpu:  # replicas on CPU devices with the cores saturated
        advice = [
            _as_contention(item) if item.code in _CONTENTION_CODES else item for item in advice
        ]
    return (
        advice + gpu_findings(frames) + cpu + batching_findings(frames) + step_time_findings(frames)
    )


def advise(frames, scaling: pd.DataFrame | None = None) -> list[Finding]:
    """The advisor's findings for the runs in ``frames``, worst first.

    With several runs, each run's findings say which run they are about.

    Args:
        frames: a ``RunFrames`` (``analysis.run_frames``).
        scaling: the runs by replica count (``summary.scaling_table``,
            ``Report.compare()``): adds the scaling finding.

    Returns:
        A list of ``Finding``, worst first (without the job findings:
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
    return sorted(advice, key=lambda item: -item.severity.level)


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
