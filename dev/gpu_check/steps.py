"""The steps of the GPU check, in order: each a command run as its own subprocess,
with its own timeout, and a CPU-dry form (``--dry-run``) where one exists."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from keras_dp_tools.records.contract import TEST_GPUS_ENV

PACKAGE = "dev.gpu_check"


@dataclass(frozen=True)
class Step:
    """``argv`` after the Python executable; ``{out}`` is the step's own folder.
    ``dry_argv``: the CPU-dry form (None: the dry run only prints the command).
    ``writes_result``: the step writes ``result.json`` (else its exit status is its
    result). ``needs_tensorflow``: skipped when the install step could not provide it.
    ``rest_of_budget``: its timeout is whatever the budget has left."""

    name: str
    title: str
    argv: tuple[str, ...]
    timeout_s: float
    dry_argv: tuple[str, ...] | None = None
    writes_result: bool = True
    needs_tensorflow: bool = True
    show_log: bool = False
    rest_of_budget: bool = False
    env: dict = field(default_factory=dict)

    def command(self, python: str, out: Path, dry: bool = False) -> list[str] | None:
        argv = self.dry_argv if dry else self.argv
        if argv is None:
            return None
        return [python, *(part.replace("{out}", str(out)) for part in argv)]


def _module(name: str, *args: str) -> tuple[str, ...]:
    return ("-m", f"{PACKAGE}.{name}", "--out", "{out}", *args)


def _training(replicas: int) -> dict:
    argv = _module("train_check", "--replicas", str(replicas))
    return {"argv": argv, "dry_argv": (*argv, "--dry-run")}


STEPS: list[Step] = [
    Step(
        "install",
        "Install from the project's files (wheelhouse / pip cache)",
        _module("install"),
        60,
        dry_argv=_module("install", "--dry-run"),
        needs_tensorflow=False,
    ),
    Step(
        "doctor",
        "keras-dp doctor --check: TensorFlow's GPUs, NVML, CUPTI tracing of one matmul",
        ("-m", "keras_dp_tools", "doctor", "--check"),
        45,
        dry_argv=("-m", "keras_dp_tools", "doctor", "--no-profile"),
        writes_result=False,
        needs_tensorflow=False,
        show_log=True,
    ),
    Step(
        "nvml_vs_smi",
        "GpuMonitor's NVML readings next to nvidia-smi's, same moments, under load",
        _module("nvml_vs_smi", "--seconds", "15"),
        40,
        dry_argv=_module("nvml_vs_smi", "--dry-run"),
        needs_tensorflow=False,
    ),
    Step(
        "fit_1gpu",
        "1-GPU fit of MobileNetV2 with our callbacks, vs XProf",
        **_training(1),
        timeout_s=80,
    ),
    Step(
        "mirrored_2", "MirroredStrategy over 2 logical GPUs, vs XProf", **_training(2), timeout_s=60
    ),
    Step(
        "mirrored_4", "MirroredStrategy over 4 logical GPUs, vs XProf", **_training(4), timeout_s=60
    ),
    Step(
        "tune_allreduce",
        "tune_allreduce over the GPU candidates on 2 logical GPUs",
        _module("tune_check", "--replicas", "2"),
        90,
        dry_argv=_module("tune_check", "--replicas", "2", "--dry-run"),
    ),
    Step(
        "tests",
        f"The full test suite with {TEST_GPUS_ENV}=1 (what the budget leaves)",
        ("-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"),
        30,  # the least worth starting
        writes_result=False,
        rest_of_budget=True,
        env={TEST_GPUS_ENV: "1"},
    ),
]
