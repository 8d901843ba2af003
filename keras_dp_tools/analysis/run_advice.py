"""The advice on a run: the advisor's findings, the scaling finding where the runs
differ in replica count, and the findings about the log dir's jobs. ``Report.advice()``
and ``RunAdvisor`` (through ``analysis.runner``) both give ``advise_run``'s.

Pure functions over a ``RunFrames``; no TensorFlow.
"""

from __future__ import annotations

from keras_dp_tools.analysis.advice import advise, rank_findings
from keras_dp_tools.analysis.job_advice import job_findings
from keras_dp_tools.analysis.summary import run_summary, scaling_table
from keras_dp_tools.common.findings import Finding


def advise_run(frames) -> list[Finding]:
    """Every finding about the runs of ``frames``, worst first.

    Args:
        frames: a ``RunFrames`` (``analysis.run_frames``).

    Returns:
        The advisor's findings (``advice.advise``, with the scaling finding where the
        runs differ in replica count) and the jobs' (``job_advice.job_findings``),
        ranked (``advice.rank_findings``: caveats, then severity, then the ms per
        step each explains).

    Example:

    ```python
    from keras_dp_tools.analysis.run_advice import advise_run
    from keras_dp_tools.analysis.run_frames import load_run_frames

    for item in advise_run(load_run_frames([("runs/demo/keras_dp/worker-0.jsonl", 0)])):
        print(item)
    ```
    """
    several = frames.step_parts.all["replicas"].nunique() > 1
    scaling = scaling_table(run_summary(frames, advice=False)) if several else None
    advice = advise(frames, scaling=scaling) + job_findings(frames)
    return rank_findings(advice)
