"""XProf unavailable for real: a fresh interpreter whose ``import xprof`` fails (a
package of that name first on its path raises ImportError, as a broken install does).
Our columns come out as with XProf working, XProf's are empty, and one XProfWarning
says why. (tests/test_schema.py makes XProf's converter fail on bytes it cannot parse.)"""

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pandas as pd
import pytest

from keras_dp_tools.analysis import analyze_trace
from keras_dp_tools.records.columns import XPROF_COLUMNS
from tests.helpers.gpu_traces import two_gpu_run

ROOT = Path(__file__).resolve().parent.parent
GPUS = ["/gpu:0", "/gpu:1"]

ANALYSE_TWICE = """
import sys, warnings
import pandas as pd
from keras_dp_tools.analysis import analyze_trace
from keras_dp_tools.analysis.breakdown.xprof_steps import XProfWarning
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    steps = analyze_trace(sys.argv[1], devices=["/gpu:0", "/gpu:1"]).steps
    analyze_trace(sys.argv[1], devices=["/gpu:0", "/gpu:1"])  # a second trace, same process
steps.to_pickle(sys.argv[2])
for warning in caught:
    if issubclass(warning.category, XProfWarning):
        print("XProfWarning:", warning.message)
print("xprof" in sys.modules and sys.modules["xprof"] is not None)
"""


@pytest.fixture
def no_xprof(tmp_path):
    """A folder that, first on PYTHONPATH, makes ``import xprof`` fail."""
    folder = tmp_path / "no_xprof"
    (folder / "xprof").mkdir(parents=True)
    (folder / "xprof" / "__init__.py").write_text(
        'raise ImportError("xprof is broken in this environment (test)")\n'
    )
    return folder


def test_without_xprof_our_columns_come_out_and_xprofs_are_empty(gpu_trace, no_xprof, tmp_path):
    trace = two_gpu_run(gpu_trace).write(tmp_path / "trace")
    good = analyze_trace(trace, devices=GPUS).steps
    assert good[XPROF_COLUMNS].notna().all().all()  # XProf works here: its numbers are in
    path = os.pathsep.join([str(no_xprof), str(ROOT), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", ANALYSE_TWICE, str(trace), str(tmp_path / "steps.pkl")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert len([line for line in lines if line.startswith("XProfWarning:")]) == 1
    assert "xprof is broken in this environment" in lines[0]
    assert lines[-1] == "False"  # XProf really was not there
    broken = pd.read_pickle(tmp_path / "steps.pkl")
    ours = [column for column in good if column not in XPROF_COLUMNS]
    pd.testing.assert_frame_equal(broken[ours], good[ours])
    assert broken[XPROF_COLUMNS].isna().all().all()


def test_analysis_in_a_child_process_still_warns_once_without_xprof(
    gpu_trace,
    no_xprof,
    tmp_path,
    monkeypatch,
):
    from keras_dp_tools.analysis.breakdown import xprof_steps
    from keras_dp_tools.analysis.runner import analyze_in_child
    from keras_dp_tools.records.facts import RunFacts

    trace = two_gpu_run(gpu_trace).write(tmp_path / "trace")
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(no_xprof), os.environ.get("PYTHONPATH", "")])
    )
    monkeypatch.setattr(xprof_steps, "_warned", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        breakdown = analyze_in_child(trace, RunFacts(devices=GPUS))
    assert breakdown.steps[XPROF_COLUMNS].isna().all().all()  # the child had no XProf
    assert len([w for w in caught if issubclass(w.category, xprof_steps.XProfWarning)]) == 1
