"""A ``sitecustomize`` that splits the first GPU into logical GPUs at interpreter start,
for processes whose TensorFlow set-up we do not run: ``tune_allreduce``'s candidates
build their strategy before any of our code is called in them."""

from __future__ import annotations

from pathlib import Path

REPLICAS_ENV = "KDT_GPU_CHECK_LOGICAL_GPUS"
MEMORY_ENV = "KDT_GPU_CHECK_LOGICAL_MB"

_SITECUSTOMIZE = f"""\
import os, sys
if int(os.environ.get({REPLICAS_ENV!r}, "0")) > 1:
    try:
        import tensorflow as tf
        from dev.gpu_check.train_check import split_first_gpu
        split_first_gpu(tf, int(os.environ[{REPLICAS_ENV!r}]), int(os.environ[{MEMORY_ENV!r}]))
    except Exception as error:  # the candidate then fails and says why
        print(f"gpu-check sitecustomize: cannot split the GPU: {{error!r}}", file=sys.stderr)
"""


def write_sitecustomize(folder: Path) -> Path:
    """Writes the folder to put first on ``PYTHONPATH``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    return folder
