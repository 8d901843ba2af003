"""Step ``tune_allreduce``: ``kdt.tune_allreduce`` over the GPU candidates (and the
default collective as the baseline) on N logical GPUs made on the first physical one."""

from __future__ import annotations

import os
import sys

from dev.gpu_check.logical_gpus import (
    MEMORY_ENV,
    REPLICAS_ENV,
    write_sitecustomize,
)
from dev.gpu_check.results import finding, step_parser, write_result

MODULE = "dev.gpu_check.tune_check"
CANDIDATES = [
    "collective",
    "collective_nccl",
    "nccl_packs_1",
    "nccl_packs_2",
    "hierarchical_copy_packs_1",
    "hierarchical_copy_packs_2",
]
# Every candidate process holds its logical GPUs at once: 6 x 2 x 10 GiB fits 139 GiB.
MEMORY_MB = 10 * 1024
IMAGE, PER_REPLICA_BATCH = 96, 32


def build_model():  # in each candidate's process, inside its strategy's scope
    import keras

    model = keras.applications.MobileNetV2(input_shape=(IMAGE, IMAGE, 3), weights=None, classes=10)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    return model


def make_dataset(global_batch: int):
    import tensorflow as tf

    images = tf.random.uniform((global_batch, IMAGE, IMAGE, 3))
    labels = tf.random.uniform((global_batch,), maxval=10, dtype=tf.int32)
    return tf.data.Dataset.from_tensors((images, labels)).repeat()


def main(argv: list[str] | None = None) -> int:
    parser = step_parser(__doc__)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args(argv)
    plan = (
        f"tune_allreduce({', '.join(CANDIDATES)}) on {args.replicas} logical GPUs of "
        f"{MEMORY_MB} MiB, MobileNetV2 {IMAGE}px, {args.steps} steps each"
    )
    if args.dry_run:
        print(f"would run {plan}")
        write_result(args.out, {"status": "dry-run", "summary": plan})
        return 0
    site = write_sitecustomize(args.out / "site")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(site), os.environ.get("PYTHONPATH")])
    )
    os.environ[REPLICAS_ENV] = str(args.replicas)
    os.environ[MEMORY_ENV] = str(MEMORY_MB)

    import keras_dp_tools as kdt

    tuning = kdt.tune_allreduce(
        f"{MODULE}:build_model",  # by name: run as __main__, this module has none
        f"{MODULE}:make_dataset",
        devices=[f"/gpu:{index}" for index in range(args.replicas)],
        steps=args.steps,
        rounds=2,
        candidates=CANDIDATES,
        per_replica_batch=PER_REPLICA_BATCH,
        log_dir=args.out / "tune",
        timeout=60,
    )
    table = tuning.table
    table.to_csv(args.out / "table.csv", index=False)
    measured = int((table["status"] == "measured").sum())
    write_result(
        args.out,
        {
            "status": "ok",
            "summary": f"best: {tuning.best}; {tuning.note}",
            "findings": [
                finding("candidates measured (none failed)", measured, len(CANDIDATES), 0)
            ],
            "notes": [f"`{line}`" for line in str(tuning).splitlines() if line.strip()]
            + ["raw: table.csv, tune/ (each candidate's records, traces and log)"],
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
