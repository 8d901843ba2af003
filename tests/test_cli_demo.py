"""The main job end to end: `keras-dp demo` in a fresh process, its records, its notebook."""

import csv as csv_module
import importlib.util
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import keras_dp_tools as kdt
from keras_dp_tools.tools.launch import free_ports
from tests.helpers import REPO
from tests.helpers.pages import text_summary
from tests.helpers.processes import run_cli


def test_demo_records_one_row_per_trained_step(demo_run):
    log_dir, result = demo_run

    report = kdt.Report.load(log_dir)

    assert len(report.steps) == 40
    assert report.steps["step"].tolist() == list(range(40))
    assert (report.steps["step_ms"] > 0).all() and (report.steps["examples_per_s"] > 0).all()
    run = report.runs.iloc[0]
    assert run["replicas"] == 2 and run["global_batch"] == 32
    assert (log_dir / "train").is_dir()  # Keras's own TensorBoard callback, same log dir
    # Three profiler windows (steps 10, 23, 36) with a breakdown per step and replica.
    assert report.windows["start_step"].tolist() == [10, 23, 36]
    assert set(report.windows["status"]) == {"analysed"}
    assert set(report.replicas["replica"]) == {0, 1}
    # The labelled summary: each line a label, the value (shares in %), its unit, and
    # the Report.summary() column it shows.
    summary = text_summary(result.stdout)
    assert summary["comm_share"]["label"] == "Communication share"
    assert summary["comm_share"]["unit"] == "%"
    assert summary["median_step_ms"]["unit"] == "ms"
    assert "How to read it:" in result.stdout
    assert f"tensorboard --logdir {log_dir}" in result.stdout


@pytest.mark.slow
def test_the_cpu_demo_shows_no_error_the_advisor_puts_down_to_contention(tmp_path):
    """Issue 27's acceptance, on a fresh demo with its defaults (4 replicas on logical
    CPU devices): where the advisor says the replicas compete for the cores, the finding
    is not an error. The demo runs on 2 cores, so they do compete on any machine."""
    result = run_cli("demo", "--log-dir", str(tmp_path / "run"), cores=2)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    advice = kdt.Report.load(tmp_path / "run").advice()
    assert any(item.code == "cpu-saturated" for item in advice), [str(a) for a in advice]
    # The issue names them: the waits (for a replica, a straggler) and the "other" time.
    contention = [
        item for item in advice if item.code in ("replica-wait", "replica-straggler", "other-time")
    ]

    assert contention, [str(item) for item in advice]  # 4 replicas on 2 cores do wait
    assert [str(item) for item in contention if item.severity == "error"] == []


def test_demo_rejects_bad_options_with_the_value():
    result = run_cli("demo", "--replicas", "0")

    assert result.returncode == 2
    assert "expected a positive integer, received 0" in result.stderr


def test_demo_explains_too_few_steps(tmp_path):
    result = run_cli("demo", "--steps", "2", "--epochs", "3", "--log-dir", str(tmp_path))

    assert result.returncode == 2  # a usage error
    assert "--steps (2) must be at least --epochs (3)" in result.stderr


def test_analyze_prints_the_breakdown_of_a_log_dir(demo_run):
    log_dir, _ = demo_run

    table = run_cli("analyze", str(log_dir))
    csv = run_cli("analyze", str(log_dir), "--csv", "--per-replica")

    assert table.returncode == 0, table.stderr[-3000:]
    assert "comm_share" in table.stdout and "sync_wait_ms" in table.stdout
    assert "analysing" in table.stderr and "(3/3)" in table.stderr
    rows = list(csv_module.DictReader(io.StringIO(csv.stdout)))
    assert len(rows) == 2 * 5 * 2 + 2 * 4  # replicas x steps: two full windows, one of 4
    assert {row["replica"] for row in rows} == {"0", "1"}
    assert all(int(row["allreduce_bytes"]) > 0 for row in rows)


def test_analyze_explains_a_folder_without_traces(tmp_path):
    result = run_cli("analyze", str(tmp_path))

    assert result.returncode == 1  # a runtime failure
    assert "No profiler traces" in result.stderr


def test_version_and_help():
    assert run_cli("--version").stdout.strip() == kdt.__version__
    assert "demo" in run_cli("--help").stdout


def test_importing_the_package_does_not_import_tensorflow():
    code = "import sys, keras_dp_tools; print('tensorflow' in sys.modules, 'keras' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )

    assert result.stdout.split() == ["False", "False"]


def test_the_demo_hint_writes_the_notebook_and_names_the_run_absolute(
    demo_run, tmp_path, monkeypatch
):
    """The hint works after a pip install (the notebook is copied from the package, not
    named in a checkout) and from any folder (the log dir is absolute: Jupyter starts
    the kernel in the notebook's folder)."""
    log_dir, result = demo_run
    hint = re.search(r"keras-dp notebook && (\S+)=(\S+) jupyter lab (\S+)", result.stdout)
    assert hint.groups() == ("KERAS_DP_LOG_DIR", str(log_dir.resolve()), "report.ipynb")

    written = run_cli("notebook", str(tmp_path) + "/")
    assert written.returncode == 0, written.stderr
    copy = tmp_path / "report.ipynb"
    assert copy.read_bytes() == (REPO / "notebooks" / "report.ipynb").read_bytes()
    again = run_cli("notebook", str(copy))
    assert again.returncode == 1 and "--force" in again.stderr  # never over your edits

    monkeypatch.chdir(tmp_path)
    from keras_dp_tools.tools.demo import notebook_hint

    assert f"KERAS_DP_LOG_DIR={tmp_path / 'runs' / 'x'} " in notebook_hint("runs/x", "r.ipynb")


def test_notebook_runs_on_the_demo_output(demo_run):
    import nbclient
    import nbformat

    log_dir, _ = demo_run
    notebook = nbformat.read(REPO / "notebooks" / "report.ipynb", as_version=4)
    client = nbclient.NotebookClient(
        notebook,
        kernel_name="python3",
        timeout=120,
        resources={"metadata": {"path": str(REPO / "notebooks")}},
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KERAS_DP_LOG_DIR", str(log_dir))
        client.execute()

    outputs = [
        output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs
    ]
    texts = "".join(
        output.get("text", "") + output.get("data", {}).get("text/plain", "") for output in outputs
    )
    images = [output for output in outputs if "image/png" in output.get("data", {})]
    assert "Report(runs=1, workers=1, step_records=40" in texts
    assert "Median step time" in texts and "sync_wait_ms" in texts  # plots.summary_table
    assert len(images) == 4  # breakdown, comm share, sync wait, step time
    assert "GPU utilization: no GPU readings: the strategy uses no GPU" in texts


def test_the_saved_notebook_reads_without_running():
    """notebooks/report.ipynb is kept with the outputs of a demo run (make notebook): a
    code host shows them. Small, every code cell answered, no path of the machine that
    made them, no execution timestamps."""
    import nbformat

    path = REPO / "notebooks" / "report.ipynb"
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)

    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    outputs = [output for cell in code for output in cell.outputs]
    assert path.stat().st_size < 1.5e6
    assert all(cell.outputs for cell in code)
    assert not [output for output in outputs if output.output_type == "error"]
    assert sum("image/png" in output.get("data", {}) for output in outputs) >= 4
    saved = "".join(_output_texts(outputs))
    assert not absolute_paths(saved)
    assert not [cell for cell in code if "execution" in cell.metadata]


# An absolute path of some machine: /a/b..., C:\a, ~/a (not "examples/s", "GB/s").
_ABSOLUTE_PATH = re.compile(
    r"""(?:^|[\s"'(\[=:,])(/[\w.+-]+(?:/[\w.+-]*)+|[A-Za-z]:\\\w|~/\w)""", re.M
)


def absolute_paths(text: str) -> list[str]:
    return [match.group(1) for match in _ABSOLUTE_PATH.finditer(text)]


def _output_texts(outputs) -> list[str]:
    """The text of each output: streams, and every text/* representation."""
    texts = []
    for output in outputs:
        texts.append("".join(output.get("text", "")))
        texts += ["".join(v) for k, v in output.get("data", {}).items() if k.startswith("text/")]
    return texts


def test_the_notebook_scrub_leaves_no_path_of_this_machine(tmp_path):
    import site
    import sysconfig

    spec = importlib.util.spec_from_file_location("regenerate", REPO / "notebooks/regenerate.py")
    regenerate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(regenerate)
    log_dir = tmp_path / "demo"
    text = "\n".join(
        [
            f"Report.load('{log_dir}')",
            f"{sysconfig.get_paths()['purelib']}/keras/src/trainer.py:12: UserWarning: x",
            f"{site.getsitepackages()[0]}/numpy/core.py:3: RuntimeWarning: y",
            f"python: {sys.executable}",
            f"{sys.base_prefix}/lib/python3/warnings.py:1",
            f"{REPO}/keras_dp_tools/report/plots.py:40: UserWarning: z",
            f"{Path.home()}/.keras/keras.json",
        ]
    )
    assert absolute_paths(text)  # the pattern finds them before the scrub

    scrubbed = regenerate.scrub(text, log_dir)

    assert not absolute_paths(scrubbed), scrubbed
    assert "Report.load('<log_dir>')" in scrubbed
    assert "keras/src/trainer.py:12: UserWarning: x" in scrubbed


def test_readme_example_script_runs(tmp_path):
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / "minimal_fit.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert result.returncode == 0, result.stderr[-3000:]
    assert kdt.Report.load(tmp_path).steps["step"].tolist() == list(range(40))


@pytest.mark.slow
def test_multiworker_example_records_each_worker_under_one_run(tmp_path):
    addresses = ",".join(f"localhost:{port}" for port in free_ports(2))
    script = str(REPO / "examples" / "multiworker_fit.py")
    env = {
        **os.environ,
        "KERAS_DP_RUN_ID": "mw-test",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PYTHONFAULTHANDLER": "1",  # a crash in TensorFlow prints the Python stack
    }
    workers = [
        subprocess.Popen(
            [sys.executable, script, str(index), str(tmp_path), addresses],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for index in range(2)
    ]
    outputs = [worker.communicate(timeout=240)[0] for worker in workers]

    assert [worker.returncode for worker in workers] == [0, 0], (
        outputs[0][-2000:] + outputs[1][-2000:]
    )
    report = kdt.Report.load(tmp_path)
    assert sorted(report.runs["worker"]) == [0, 1]
    assert set(report.runs["run"]) == {"mw-test"} and set(report.runs["workers"]) == {2}
    assert report.steps.groupby("worker")["step"].apply(list).to_dict() == {
        0: list(range(10)),
        1: list(range(10)),
    }
    assert report.summary().loc["mw-test", "workers"] == 2
    # Worker 0 profiles its own replica; other workers do not by default (TF's profiler
    # stop crashed non-chief workers intermittently).
    windows = report.windows.set_index("worker")
    diagnosis = windows.to_string() + outputs[0][-1500:] + outputs[1][-1500:]
    assert windows["status"].to_dict() == {0: "analysed", 1: "skipped"}, diagnosis
    assert "only worker 0 profiles" in windows.loc[1, "reason"], diagnosis
    assert windows.loc[0, "trace"].startswith("train/plugins/profile/"), diagnosis
    assert sorted(report.replicas["worker"].unique()) == [0]
    assert (report.replicas["replica"] == 0).all()


@pytest.mark.slow
def test_sweep_runs_the_demo_per_replica_count_and_compares(tmp_path):
    result = run_cli(
        "sweep",
        "demo",
        "--replicas",
        "2,1",
        "--log-dir",
        str(tmp_path),
        "--",
        "--steps",
        "24",
        "--epochs",
        "1",
    )

    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "[1/2] 1 replica(s)" in result.stdout and "[2/2] 2 replica(s)" in result.stdout
    assert "scaling_efficiency" in result.stdout
    assert (tmp_path / "scaling.png").stat().st_size > 0
    report = kdt.Report.load(tmp_path)
    assert sorted(report.runs["replicas"]) == [1, 2]
    assert report.compare()["replicas"].tolist() == [1, 2]
    assert (tmp_path / "replicas-2" / "output.log").read_text().count("2 replicas") == 1


def test_sweep_rejects_bad_replica_lists():
    result = run_cli("sweep", "demo", "--replicas", "1,x")
    assert result.returncode == 2
    assert "expected positive integers separated by commas, received '1,x'" in result.stderr
