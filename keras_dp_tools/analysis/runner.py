"""The analysis runner: the one door from capture into the analysis.

A callback hands a finished profiler window (its trace and ``RunFacts``) or a finished
run (its records) to the runner and gets the result back; it holds no analysis itself.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from keras_dp_tools.analysis.advice import AdvisorFrames, advice_markdown
from keras_dp_tools.analysis.frames import load_frames
from keras_dp_tools.analysis.summary import run_advice

# --- A finished run: the advice for RunAdvisor ----------------------------------------


def run_advice_markdown(files: Iterable[tuple[str | os.PathLike, int]], run_id: str) -> str:
    """The advisor's findings for run ``run_id`` as a markdown list (TensorBoard's Text
    tab): the records ``files``, each read from a byte offset (``Recorder.run_offset``:
    this run's lines, not the runs before it), through the analyzers of ``Report``
    (``Report.from_files(files).for_run(run_id).advice()``)."""
    frames = AdvisorFrames.of_mapping(load_frames(files)).for_run(run_id)
    return advice_markdown(run_advice(frames))
