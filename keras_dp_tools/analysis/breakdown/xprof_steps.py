"""XProf's own per-step numbers for a trace, through its offline converters.

XProf merges all devices of a step into one timeline and counts a slice as collective
only when no device computes (see docs/breakdown.md), so its ``deviceCollectivesTimeMs``
is a lower bound on exposed communication, shown next to ours for comparison.

XProf is a second opinion, not a dependency of ours: if it fails (not installed, a
trace or cache it cannot read, a converter error), our columns still come out, its
columns stay empty, and one ``XProfWarning`` per process says why.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from pathlib import Path

import pandas as pd

from keras_dp_tools.common.warn import warn
from keras_dp_tools.records.columns import XPROF_COLUMNS

logger = logging.getLogger("keras_dp_tools")


class XProfWarning(UserWarning):
    """XProf's converter failed on a trace: its columns are empty, ours are not."""


_warned = False
_warned_lock = threading.Lock()
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
    ``xprof_device_to_device_ms``; empty if XProf found no steps or failed (with an
    ``XProfWarning``, once per process).
    """
    try:
        return _step_table(path)
    except Exception as error:  # XProf's failure must not cost our own columns
        _warn_once(f"XProf could not convert {path} ({type(error).__name__}: {error})")
        return _empty()


def _warn_once(message: str) -> None:
    relay_warning(f"{message}; its xprof_* columns are left empty, ours are not affected.")


def relay_warning(text: str) -> None:
    """Issues an ``XProfWarning`` with ``text`` unless this process already did (later
    ones are logged). For a child process that analysed a trace: its warnings go to
    its own stderr, so the parent relays the texts the child recorded."""
    global _warned
    with _warned_lock:
        first, _warned = not _warned, True
    if first:
        warn(text, XProfWarning)
    else:
        logger.info("%s", text)


def _empty() -> pd.DataFrame:
    return pd.DataFrame(columns=["step", *XPROF_COLUMNS]).astype(
        {"step": "int64", **dict.fromkeys(XPROF_COLUMNS, "float64")}
    )


def _step_table(path) -> pd.DataFrame:
    from xprof.convert import raw_to_tool_data

    # use_saved_result=False: never serve a cache computed from an older trace version.
    data, _ = raw_to_tool_data.xspace_to_tool_data(
        [str(Path(path))], "input_pipeline_analyzer", {"use_saved_result": False}
    )
    if data is None:  # how XProf 2.24 fails on a file it cannot parse or read
        raise RuntimeError("its converter returned no data (XProf's log says why)")
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
        return frame[["step", *XPROF_COLUMNS]].reset_index(drop=True)
    return _empty()


def align_steps(xprof_steps: pd.DataFrame, steps: pd.Series) -> pd.DataFrame:
    """XProf names device steps by its own step groups (0, 1, ...) rather than the
    markers' ``step_num``; both list the steps in time order, so pair them by position
    when the numbers differ but the counts match (on GPU, XProf's 0, 1 would otherwise
    meet our steps 1, 2 one off). XProf's numbers that are all ours pair by number;
    otherwise (other numbers, another count: e.g. two profilers' crossing markers,
    which XProf may group apart) nothing pairs, and XProf's columns stay empty rather
    than meet the wrong steps."""
    if set(xprof_steps["step"]) <= set(steps):
        return xprof_steps
    if len(xprof_steps) != len(steps):
        return xprof_steps.iloc[0:0]
    return xprof_steps.assign(step=steps.sort_values().to_numpy())
