"""XProf's own per-step numbers for a trace, through its offline converters.

XProf merges all devices of a step into one timeline and counts a slice as collective
only when no device computes (see docs/breakdown.md), so its ``deviceCollectivesTimeMs``
is a lower bound on exposed communication, shown next to ours for comparison.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pandas as pd

_STEP_NAME = re.compile(r"(\d+)\s*$")
_COLUMNS = {
    "stepTimeMs": "xprof_step_ms",
    "deviceCollectivesTimeMs": "xprof_collectives_ms",
    "deviceComputeTimeMs": "xprof_device_compute_ms",
    # XProf 2.24 files CUPTI's "MemcpyD2D" under compute: it knows only "MemcpyDToD".
    "deviceToDeviceTimeMs": "xprof_device_to_device_ms",
}


def xprof_step_table(path: str | os.PathLike) -> pd.DataFrame:
    """XProf's ``input_pipeline_analyzer`` step table for one trace.

    Returns one row per step XProf detected, with ``step`` (the marker's ``step_num``)
    and ``xprof_step_ms``, ``xprof_collectives_ms``, ``xprof_device_compute_ms``,
    ``xprof_device_to_device_ms``; empty if XProf found no steps.
    """
    from xprof.convert import raw_to_tool_data

    # use_saved_result=False: never serve a cache computed from an older trace version.
    data, _ = raw_to_tool_data.xspace_to_tool_data(
        [str(Path(path))], "input_pipeline_analyzer", {"use_saved_result": False}
    )
    tables = json.loads(data) if data else []
    for table in tables if isinstance(tables, list) else []:
        columns = [column.get("id") for column in table.get("cols", [])]
        if "stepnum" not in columns:
            continue
        rows = [[cell.get("v") for cell in row["c"]] for row in table.get("rows", [])]
        frame = pd.DataFrame(rows, columns=columns)
        steps = frame["stepnum"].astype(str).str.extract(_STEP_NAME, expand=False)
        frame = frame.assign(step=pd.to_numeric(steps, errors="coerce")).dropna(subset=["step"])
        frame = frame.astype({"step": "int64"}).rename(columns=_COLUMNS)
        return frame[["step", *_COLUMNS.values()]].reset_index(drop=True)
    return pd.DataFrame(columns=["step", *_COLUMNS.values()])
