"""The strategies ``compare_strategies`` can measure: how many replicas each has here,
the code that builds it, why it cannot run here, and the processes that run it.

On GPUs a candidate takes the GPUs; without, the CPU split into logical devices
(``KERAS_DP_REPLICAS`` or 4, as ``kdt.configure_devices``). ``one_device`` takes one
device. ``MultiWorkerMirroredStrategy`` puts one CPU device per worker (it does not use
logical CPU devices), so on CPU it runs as many local workers as the others have
replicas, one device each; on GPUs each worker gets one GPU.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from keras_dp_tools.records.contract import REPLICAS_ENV
from keras_dp_tools.setup.devices import DEFAULT_CPU_REPLICAS, requested_replicas
from keras_dp_tools.tools.strategies import parameter_server
from keras_dp_tools.tools.tuning.child import tf_keras_missing
from keras_dp_tools.tools.tuning.rounds import Launch

TRIAL_MODULE = "keras_dp_tools.tools.strategies._strategy_trial"
NAMES = (
    "one_device",
    "mirrored",
    "central_storage",
    "multi_worker_mirrored",
    "parameter_server",
)
LABELS = {
    "one_device": "OneDeviceStrategy",
    "mirrored": "MirroredStrategy",
    "central_storage": "CentralStorageStrategy",
    "multi_worker_mirrored": "MultiWorkerMirroredStrategy",
    "parameter_server": "ParameterServerStrategy",
}
# Keras 3's fit fails under MultiWorkerMirroredStrategy (keras-team/keras#20585).
LEGACY_KERAS_ENV = {"TF_USE_LEGACY_KERAS": "1"}


@dataclass(frozen=True)
class Machine:
    """What the candidates may use: ``gpus`` (their ids), ``cpu_replicas`` (logical CPU
    devices when there are none)."""

    gpus: tuple[str, ...]
    cpu_replicas: int

    @classmethod
    def here(cls) -> Machine:
        from keras_dp_tools.tools.sweep import gpu_ids

        return cls(tuple(gpu_ids()), requested_replicas(None) or DEFAULT_CPU_REPLICAS)

    @property
    def devices(self) -> int:
        return len(self.gpus) or self.cpu_replicas


def default_options(name: str, machine: Machine) -> dict:
    """The options a candidate runs with when none are given: every device of
    ``machine`` (as replicas or workers), or the parameter server's defaults."""
    if name == "one_device":
        return {}
    if name == "multi_worker_mirrored":
        return {"workers": machine.devices}
    if name == "parameter_server":
        return dict(parameter_server.DEFAULT_OPTIONS)
    return {"replicas": machine.devices}


def replicas(name: str, options: dict) -> int:
    """Replicas that each take ``per_replica_batch`` examples per step."""
    if name == "one_device":
        return 1
    if name == "multi_worker_mirrored":
        return int(options["workers"])
    if name == "parameter_server":
        return parameter_server.replicas(options)
    return int(options["replicas"])


def skip_reason(name: str, options: dict, machine: Machine) -> str | None:
    """Why ``name`` cannot run here with ``options`` (None when it can)."""
    if name == "parameter_server":
        return parameter_server.skip_reason(options)
    if name == "multi_worker_mirrored":
        missing = tf_keras_missing(LABELS[name])
        if missing:
            return missing
    wanted = replicas(name, options)
    if machine.gpus and wanted > len(machine.gpus):
        return f"needs {wanted} GPUs, {len(machine.gpus)} are visible"
    if name in ("mirrored", "central_storage") and wanted < 2:
        return f"{LABELS[name]} over 1 device is one_device with extra copies"
    return None


def _device(machine: Machine) -> str:
    return "/gpu:0" if machine.gpus else "/cpu:0"


def code(name: str, options: dict, machine: Machine) -> str:
    """The Python lines that build the candidate's strategy (what ``.code`` shows)."""
    if name == "parameter_server":
        return parameter_server.code(options)
    lines = ["import tensorflow as tf"]
    if name == "one_device":
        lines.append(f'strategy = tf.distribute.OneDeviceStrategy("{_device(machine)}")')
    elif name == "multi_worker_mirrored":
        workers = options["workers"]
        lines = [
            f"# In each of {workers} worker processes, with TF_CONFIG naming all of them",
            f"# (keras-dp launch --workers {workers} -- python train.py), with tf_keras:",
            "import os",
            'os.environ["TF_USE_LEGACY_KERAS"] = "1"  # before TensorFlow is imported',
            *lines,
            "strategy = tf.distribute.MultiWorkerMirroredStrategy()",
        ]
    else:
        constructor = {
            "mirrored": "tf.distribute.MirroredStrategy",
            "central_storage": "tf.distribute.experimental.CentralStorageStrategy",
        }[name]
        lines.append("import keras_dp_tools as kdt")
        lines.append(f"strategy = {constructor}(kdt.configure_devices({options['replicas']}))")
    return "\n".join(lines)


def _worker_env(machine: Machine, index: int, cluster: dict) -> dict:
    env = {
        **LEGACY_KERAS_ENV,
        "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}),
    }
    if machine.gpus:
        env["CUDA_VISIBLE_DEVICES"] = machine.gpus[index]
    else:  # one CPU device per worker: MultiWorkerMirroredStrategy uses no more
        env[REPLICAS_ENV] = "1"
    return env


def launches(name: str, options: dict, machine: Machine, spec: dict, folder: Path) -> list[Launch]:
    """The processes that run the candidate, the one that answers first."""
    if name == "parameter_server":
        # Its module sets TF_USE_LEGACY_KERAS itself, before TensorFlow is imported.
        return [Launch(parameter_server.CHILD_MODULE, spec, folder / "output.log")]
    if name != "multi_worker_mirrored":
        return [Launch(TRIAL_MODULE, spec, folder / "output.log")]
    from keras_dp_tools.tools.launch import free_ports

    workers = int(options["workers"])
    cluster = {"worker": [f"localhost:{port}" for port in free_ports(workers)]}
    return [
        Launch(
            TRIAL_MODULE,
            spec,
            folder / f"output-worker-{index}.log",
            _worker_env(machine, index, cluster),
        )
        for index in range(workers)
    ]
