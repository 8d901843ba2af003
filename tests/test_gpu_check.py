"""``make gpu-check`` without a GPU: the no-GPU path, the dry run, the runner's
timeouts, and the report writer on recorded step results (tests/fixtures/gpu_check/)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dev.gpu_check.machine import HIDE_GPUS_ENV
from dev.gpu_check.report import render, step_status, write_report
from dev.gpu_check.results import read_result, verdict
from dev.gpu_check.runner import run_all
from dev.gpu_check.steps import STEPS, Step
from keras_dp_tools.tools import doctor
from tests.helpers import REPO
from tests.helpers.processes import run_module

FIXTURES = REPO / "tests" / "fixtures" / "gpu_check"
MACHINE = {"host": "test", "GPUs": "NVIDIA H200 (recorded)"}


def _check(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {HIDE_GPUS_ENV: "1", "PYTHONPATH": str(REPO)}
    return run_module("dev.gpu_check", *args, env=env, timeout=timeout)


def test_without_a_gpu_it_says_so_in_one_line_and_exits_0(tmp_path):
    out = tmp_path / "report"
    done = _check("--out", str(out))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("no GPU: "), done.stdout
    assert HIDE_GPUS_ENV in lines[0]
    assert not out.exists()  # nothing written, nothing run


def test_dry_run_lists_every_step_and_runs_their_cpu_forms(tmp_path):
    done = _check("--out", str(tmp_path), "--dry-run")
    assert done.returncode == 0, done.stderr
    for step in STEPS:
        assert f"[{step.name}] dry-run" in done.stdout, (step.name, done.stdout)
        result = read_result(tmp_path / step.name)
        assert result["status"] == "dry-run", result
        if step.dry_argv is not None:
            assert "--dry-run" in result["dry_command"] or "--no-profile" in result["dry_command"]
    assert done.stdout.count("would run: ") == len(STEPS)
    assert "KERAS_DP_TEST_GPUS=1" in done.stdout  # the suite's step shows its setting
    report = (tmp_path / "REPORT.md").read_text()
    assert "state: complete" in report
    assert report.count("| DRY-RUN |") == len(STEPS)


def _fixture_results() -> list[dict]:
    names = ["install", "nvml_vs_smi", "fit_1gpu", "mirrored_2"]
    return [json.loads((FIXTURES / name / "result.json").read_text()) for name in names]


def _row(report: str, check: str) -> list[str]:
    [line] = [line for line in report.splitlines() if line.startswith(f"| {check} |")]
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_report_on_recorded_results_gives_each_rows_verdict(tmp_path):
    path = write_report(tmp_path, _fixture_results(), ["tests"], MACHINE, "partial: running")
    report = path.read_text()
    # 11.5 ms against XProf's 10.0 ms is 15% off, over the 10% tolerance.
    compute = _row(report, "median device compute per step vs XProf device compute")
    assert compute[1:] == ["11.5 ms", "10 ms", "15.0%", "10.0%", "FAIL"]
    step = _row(report, "median step time vs XProf step time")  # 20.4 vs 20.0: 2%
    assert step[3:] == ["2.0%", "10.0%", "PASS"]
    assert _row(report, "all-reduce on one replica")[5] == "PASS"
    assert _row(report, "GPU 0 mem_used_gb, mean of 60 pairs")[3:] == ["0.02", "0.25", "PASS"]
    assert _row(report, "median all-reduce per step vs XProf collectives")[5] == "n/a"
    # Step lines: a tolerance exceeded turns an ok step into FAIL; an install that
    # could not install says so; the step not yet run is pending.
    assert _row(report, "fit_1gpu")[1] == "FAIL (1 of 4 checks)"
    assert _row(report, "nvml_vs_smi")[1] == "OK"
    assert _row(report, "install")[1] == "FAILED"
    assert "missing tensorflow, keras" in report
    assert _row(report, "tests")[1] == "PENDING"
    assert "state: partial: running" in report and "GPUs: NVIDIA H200 (recorded)" in report


def test_verdict_edges():
    row = {"ours": 10.25, "reference": 10.0, "tolerance": 0.25, "relative": False}
    assert verdict(row) == ("PASS", 0.25)  # the tolerance itself passes
    assert verdict({**row, "ours": 10.26})[0] == "FAIL"
    assert verdict({**row, "reference": 0.0, "ours": 0.0, "relative": True}) == ("PASS", None)
    assert verdict({**row, "reference": 0.0, "ours": 0.1, "relative": True})[0] == "FAIL"
    assert verdict({**row, "ours": None})[0] == "n/a"
    assert step_status({"status": "ok", "findings": [row]}) == "OK"


def _fake(name: str, code: str, timeout_s: float, **options) -> Step:
    return Step(name, f"fake {name}", ("-c", code), timeout_s, needs_tensorflow=False, **options)


def test_a_hanging_step_is_killed_at_its_timeout_and_the_next_ones_run(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    hang = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "print('hanging', flush=True); time.sleep(120)\n"
    )
    writes = (
        "import json, pathlib, sys\n"
        "out = pathlib.Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)\n"
        "row = {'check': 'x', 'ours': 2.0, 'reference': 1.0, 'tolerance': 0.5}\n"
        "(out / 'result.json').write_text(json.dumps("
        "{'status': 'ok', 'summary': 'wrote', 'findings': [row]}))\n"
    )
    steps = [
        _fake("hang", hang, 8, writes_result=False),
        _fake("fails", "raise SystemExit(3)", 30, writes_result=False),
        Step("writes", "fake writes", ("-c", writes, "{out}"), 30, needs_tensorflow=False),
        _fake("crashes", "raise SystemExit(0)", 30),  # says it writes a result, does not
        _fake("after", "print('ran')", 30, writes_result=False),
    ]
    reports = []

    def after_each(results):
        write_report(tmp_path, results, [s.name for s in steps[len(results) :]], MACHINE, "x")
        reports.append((tmp_path / "REPORT.md").read_text())

    started = time.monotonic()
    results = {
        r["step"]: r for r in run_all(steps, tmp_path, 120, sys.executable, False, after_each)
    }
    assert time.monotonic() - started < 90
    assert results["hang"]["status"] == "timeout"
    assert 8 <= results["hang"]["seconds"] < 25
    assert "hanging" in (tmp_path / "hang" / "log.txt").read_text()
    grandchild = int(pid_file.read_text())
    # Killed with its step's process group, though it ignores TERM (a zombie is dead).
    stat = Path(f"/proc/{grandchild}/stat")
    for _ in range(50):
        if not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the hanging step's child {grandchild} outlived it")
    assert results["fails"]["status"] == "failed" and results["fails"]["returncode"] == 3
    assert results["after"]["summary"] == "exit status 0: ran"  # the log's last line
    assert step_status(results["writes"]) == "FAIL (1 of 1 checks)"
    assert results["crashes"]["status"] == "crashed"
    assert results["after"]["status"] == "ok"
    # Written after every step: the first report already shows the hang and what is left.
    assert "| hang | TIMEOUT |" in reports[0] and "| after | PENDING |" in reports[0]
    assert "| after | OK |" in reports[-1]


def test_the_budget_cuts_timeouts_and_skips_what_does_not_fit(tmp_path):
    steps = [
        _fake("long", "import time; time.sleep(60)", 50, writes_result=False),
        _fake("next", "print(1)", 30, writes_result=False),
        _fake("suite", "print(1)", 30, writes_result=False, rest_of_budget=True),
    ]
    results = run_all(steps, tmp_path, 12, sys.executable)  # long's 50 s cut to 12
    assert [r["status"] for r in results] == ["timeout", "skipped", "skipped"]
    assert 12 <= results[0]["seconds"] < 25
    assert "budget spent" in results[1]["summary"]


def test_steps_needing_tensorflow_skip_when_the_install_could_not(tmp_path):
    install = (
        "import json, pathlib, sys\n"
        "out = pathlib.Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)\n"
        "(out / 'result.json').write_text(json.dumps({'status': 'failed', "
        "'tensorflow': False, 'summary': 'no wheels'}))\n"
    )
    steps = [
        Step("install", "i", ("-c", install, "{out}"), 30, needs_tensorflow=False),
        Step("fit", "f", ("-c", "print(1)"), 30, writes_result=False),
        _fake("nvml", "print(1)", 30, writes_result=False),
    ]
    results = run_all(steps, tmp_path, 60, sys.executable)
    assert [r["status"] for r in results] == ["failed", "skipped", "ok"]
    assert "TensorFlow is not installed: no wheels" in results[1]["summary"]
    assert "TensorFlow is not installed" in render(tmp_path, results, [], MACHINE, "complete")


GPU_MACHINE = [
    (
        "TensorFlow",
        [
            ("tensorflow", "2.21.0"),
            ("built with CUDA", "True"),
            ("physical GPUs", "/physical_device:GPU:0"),
        ],
    ),
    ("NVML", [("driver", "570.1")]),
    ("nvidia-smi", [("00000000:1b:00.0", "util_gpu smi 0.0 / nvml 0.0")]),
    (
        "Profiler (CUPTI)",
        [("libcupti", "/usr/lib/libcupti.so.12"), ("device tracing", "works: ...")],
    ),
]


def test_doctor_check_names_each_failed_gpu_machine_check():
    assert doctor.check_failures(GPU_MACHINE) == []
    cpu_only = [
        (
            "TensorFlow",
            [("tensorflow", "2.21.0"), ("built with CUDA", "True"), ("physical GPUs", "none")],
        ),
        ("NVML", [("status", "unavailable: no driver")]),
        ("nvidia-smi", [("status", "not found on PATH")]),
        ("Profiler (CUPTI)", [("libcupti", "not found (...)"), ("device tracing", "not tried")]),
    ]
    assert doctor.check_failures(cpu_only) == [
        "TensorFlow sees a GPU",
        "NVML opens",
        "nvidia-smi answers",
        "a CUPTI library loads",
        "the profiled matmul leaves device events",
    ]
    assert "the profiled matmul leaves device events" not in doctor.check_failures(
        cpu_only, profile=False
    )


def test_training_comparison_fails_a_step_whose_kernels_moved():
    pd = pytest.importorskip("pandas")
    from types import SimpleNamespace

    from dev.gpu_check.train_check import compare

    # Hand-made: XProf puts 10 ms of device compute in every step; ours moved 2 ms of
    # step 12's kernels into step 13 (same total, so the medians alone would not see it).
    steps = pd.DataFrame(
        {
            "step": [10, 11, 12, 13, 14],
            "step_ms": [20.0] * 5,
            "compute_ms": [10.0, 10.0, 8.0, 12.0, 10.0],
            "allreduce_ms": [0.0] * 5,
            "xprof_device_compute_ms": [10.0] * 5,
            "xprof_step_ms": [20.0] * 5,
        }
    )
    findings, _ = compare(SimpleNamespace(steps=steps, replicas=None), 1, 0)
    verdicts = {row["check"]: verdict(row) for row in findings}
    assert verdicts["profiled steps with a breakdown"][0] == "PASS"
    assert verdicts["median device compute per step vs XProf device compute"] == ("PASS", 0.0)
    assert verdicts["worst step: |ours - XProf| / XProf device compute"] == ("FAIL", 0.2)
    assert verdicts["all-reduce on one replica"][0] == "PASS"
    steps.loc[0, "allreduce_ms"] = steps.loc[1, "allreduce_ms"] = steps.loc[2, "allreduce_ms"] = 0.5
    findings, _ = compare(SimpleNamespace(steps=steps, replicas=None), 1, 0)
    assert verdict(findings[-1]) == ("FAIL", 0.5)  # one replica has nothing to all-reduce


def test_nvml_comparison_pairs_readings_per_gpu():
    from types import SimpleNamespace

    from dev.gpu_check.nvml_vs_smi import compare

    rows = [
        {"gpu": 0, "nvml_power_w": 100.0, "smi_power_w": 60.0, "nvml_util_gpu": 50.0},
        {"gpu": 0, "nvml_power_w": 120.0, "smi_power_w": 100.0, "nvml_util_gpu": 50.0},
    ]
    for row in rows:
        for name in ("util_gpu", "util_memory", "mem_used_gb", "mem_total_gb", "power_w"):
            row.setdefault(f"nvml_{name}", None)
            row.setdefault(f"smi_{name}", None)
        for name in ("sm_clock_mhz", "temperature_c"):
            row[f"nvml_{name}"] = row[f"smi_{name}"] = 1.0
    findings, notes = compare([SimpleNamespace(gpu=0)], rows)
    by_name = {row["check"].split(",")[0]: row for row in findings}
    # Means 110 W against 80 W: 30 W apart, over the 25 W tolerance.
    assert verdict(by_name["GPU 0 power_w"]) == ("FAIL", 30.0)
    assert verdict(by_name["GPU 0 util_gpu"])[0] == "n/a"  # nvidia-smi gave no number
    assert verdict(by_name["GPU 0 sm_clock_mhz"]) == ("PASS", 0.0)
    assert "GPU 0 power_w: largest single-pair difference 40" in notes


def test_install_never_touches_an_environment_other_than_the_checkouts_venv(tmp_path, monkeypatch):
    from dev.gpu_check import install

    # A checkout whose .venv this interpreter is, then one whose .venv it is not.
    monkeypatch.setattr(install.sys, "prefix", str(tmp_path / "checkout" / ".venv"))
    monkeypatch.setattr(install, "REPO", tmp_path / "checkout")
    assert install.own_environment_refusal() is None
    monkeypatch.setattr(install, "REPO", tmp_path / "another-checkout")
    assert install.own_environment_refusal() is not None
    monkeypatch.setattr(install, "importable", lambda: dict.fromkeys((*install.NEEDED, "pynvml")))

    def pip(*args):
        raise AssertionError("pip ran outside the checkout's own .venv")

    monkeypatch.setattr(install, "install", pip)
    assert install.main(["--out", str(tmp_path)]) == 0
    result = read_result(tmp_path)
    assert result["status"] == "failed" and result["tensorflow"] is False
    assert "not installing into" in result["summary"]
    assert "only the steps that need no TensorFlow run" in result["summary"]
