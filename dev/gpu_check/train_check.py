"""Steps ``fit_1gpu`` / ``mirrored_2`` / ``mirrored_4``: ``fit`` MobileNetV2 (random
weights) with ``kdt.callbacks`` on 1 GPU, or under ``MirroredStrategy`` over N logical
GPUs made on the first physical one, then hold the breakdown of the capture against
XProf's numbers for the same capture and against facts known without the trace."""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from dev.gpu_check import tolerances as tol
from dev.gpu_check.results import finding, step_parser, write_result

PROFILE_START, WINDOW = 10, 5  # kdt.callbacks' default window: steps 10..14
# Per logical GPU: the H200's 139 GiB leaves room for 4 of these and the NCCL buffers.
LOGICAL_GPU_MEMORY_MB = 24 * 1024
_NCCL_KERNEL = re.compile(rb"nccl[A-Za-z0-9_]*Kernel[A-Za-z0-9_]*")


def split_first_gpu(tf, replicas: int, memory_mb: int = LOGICAL_GPU_MEMORY_MB) -> list[str]:
    """``replicas`` logical GPUs of ``memory_mb`` each on the first physical one (before
    TF initialises)."""
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        raise RuntimeError("TensorFlow sees no GPU (is it the CUDA build? see the doctor step)")
    if replicas > 1:
        config = tf.config.LogicalDeviceConfiguration(memory_limit=memory_mb)
        tf.config.set_logical_device_configuration(gpus[0], [config] * replicas)
    return [f"/gpu:{index}" for index in range(replicas)]


def build_model(keras, image: int):
    model = keras.applications.MobileNetV2(input_shape=(image, image, 3), weights=None, classes=10)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    return model


def dataset(tf, global_batch: int, image: int):
    images = tf.random.uniform((global_batch, image, image, 3))
    labels = tf.random.uniform((global_batch,), maxval=10, dtype=tf.int32)
    return tf.data.Dataset.from_tensors((images, labels)).repeat().prefetch(2)


def nccl_kernels(trace: Path) -> list[str]:
    """NCCL kernel names in the capture: CUPTI names every kernel it traced."""
    try:
        data = trace.read_bytes()
    except OSError:
        return []
    return sorted({name.decode() for name in _NCCL_KERNEL.findall(data)})


def _median(frame, column):
    if column not in frame or frame[column].dropna().empty:
        return None
    return float(frame[column].median())


def _medians_agree(steps, check: str, ours: str, reference: str, tolerance) -> dict:
    """The finding that the median of column ``ours`` (ms) over the profiled steps is
    within ``tolerance`` (a fraction) of the median of column ``reference``."""
    median_ours, median_reference = _median(steps, ours), _median(steps, reference)
    return finding(check, median_ours, median_reference, tolerance, relative=True, unit="ms")


def compare(report, replicas: int, parameter_bytes: int) -> tuple[list[dict], list[str]]:
    steps = report.steps[report.steps["compute_ms"].notna()]
    findings = [finding("profiled steps with a breakdown", len(steps), WINDOW, 0)]
    notes = []
    if steps.empty:
        return findings, notes
    findings.append(
        _medians_agree(
            steps,
            "median device compute per step vs XProf device compute",
            "compute_ms",
            "xprof_device_compute_ms",
            tol.COMPUTE_VS_XPROF,
        )
    )
    if "xprof_device_compute_ms" in steps:
        # A kernel counted in the wrong step moves its time between steps: per step,
        # ours and XProf's (which groups device ops by step on its own) then part.
        paired = steps[["step", "compute_ms", "xprof_device_compute_ms"]].dropna()
        worst = (
            (paired["compute_ms"] - paired["xprof_device_compute_ms"]).abs()
            / paired["xprof_device_compute_ms"]
        ).max()
        findings.append(
            finding(
                "worst step: |ours - XProf| / XProf device compute",
                None if paired.empty else worst,
                0.0,
                tol.COMPUTE_VS_XPROF,
            )
        )
    findings.append(
        finding(
            "steps whose device compute exceeds their step time",
            int((steps["compute_ms"] > steps["step_ms"]).sum()),
            0,
            0,
        )
    )
    findings.append(
        _medians_agree(
            steps,
            "median step time vs XProf step time",
            "step_ms",
            "xprof_step_ms",
            tol.STEP_VS_XPROF,
        )
    )
    allreduce = _median(steps, "allreduce_ms")
    if replicas == 1:
        findings.append(
            finding(
                "all-reduce on one replica",
                allreduce,
                0.0,
                tol.SINGLE_REPLICA_ALLREDUCE_MS,
                unit="ms",
            )
        )
        return findings, notes
    findings.append(
        _medians_agree(
            steps,
            "median all-reduce per step vs XProf collectives",
            "allreduce_ms",
            "xprof_collectives_ms",
            tol.ALLREDUCE_VS_XPROF,
        )
    )
    findings.append(
        finding(
            "all-reduce bytes per step vs trainable parameters x 4",
            _median(steps, "allreduce_bytes"),
            parameter_bytes,
            tol.BYTES_VS_PARAMETERS,
            relative=True,
            unit="B",
        )
    )
    columns = ["compute_ms", "allreduce_ms", "sync_wait_ms", "busbw_gbps"]
    per_replica = report.replicas.groupby("replica")[columns].median().round(3)
    notes.append("per replica, medians over the profiled steps:")
    notes.extend(
        f"replica {index}: " + ", ".join(f"{name} {float(value):g}" for name, value in row.items())
        for index, row in per_replica.iterrows()
    )
    return findings, notes


def main(argv: list[str] | None = None) -> int:
    parser = step_parser(__doc__)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--per-replica-batch", type=int, default=64)
    parser.add_argument("--image", type=int, default=128)
    parser.add_argument(
        "--cross-device-ops",
        default="collective",
        help="a tune_allreduce candidate's name (default: MirroredStrategy's own choice)",
    )
    # Set when this process replaced one whose fit failed with the default (see below).
    parser.add_argument("--after-failure", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.replicas < 1 or args.steps < PROFILE_START + WINDOW + 2:
        parser.error(
            f"need --replicas >= 1 and --steps >= {PROFILE_START + WINDOW + 2} (the profiler "
            f"window is steps {PROFILE_START}..{PROFILE_START + WINDOW - 1}); received "
            f"--replicas {args.replicas} --steps {args.steps}"
        )
    plan = (
        f"MobileNetV2({args.image}x{args.image}x3, random weights) x {args.steps} steps, "
        f"{args.per_replica_batch} images per replica, MirroredStrategy over "
        f"{args.replicas} {'logical ' if args.replicas > 1 else ''}GPU(s)"
        + (f" of {LOGICAL_GPU_MEMORY_MB} MiB each" if args.replicas > 1 else "")
        + f", cross-device ops: {args.cross_device_ops}"
        + f", kdt.callbacks profiling steps {PROFILE_START}..{PROFILE_START + WINDOW - 1}"
    )
    if args.dry_run:
        print(f"would fit {plan}, then compare the breakdown with XProf's numbers")
        write_result(args.out, {"status": "dry-run", "summary": plan})
        return 0
    import keras
    import tensorflow as tf

    import keras_dp_tools as kdt
    from keras_dp_tools.tools.tuning.allreduce import CANDIDATES

    if args.cross_device_ops not in CANDIDATES:
        parser.error(
            f"--cross-device-ops {args.cross_device_ops!r} is not one of {', '.join(CANDIDATES)}"
        )
    devices = split_first_gpu(tf, args.replicas)
    namespace: dict = {}
    exec(CANDIDATES[args.cross_device_ops].code(repr(devices)), namespace)  # builds strategy
    strategy = namespace["strategy"]
    global_batch = args.per_replica_batch * args.replicas
    with strategy.scope():
        model = build_model(keras, args.image)
    parameter_bytes = 4 * sum(int(tf.size(w)) for w in model.trainable_weights)
    log_dir = args.out / f"run-{args.cross_device_ops}"
    try:
        model.fit(
            dataset(tf, global_batch, args.image),
            steps_per_epoch=args.steps,
            epochs=1,
            verbose=2,
            callbacks=kdt.callbacks(log_dir, global_batch=global_batch, advise=False),
        )
    except Exception as error:
        if args.replicas == 1 or args.cross_device_ops != "collective":
            raise
        # NCCL may refuse two ranks on one physical GPU. Collective state does not reset
        # within a process, so the ring implementation gets a fresh one (same timeout).
        why = f"{type(error).__name__}: {str(error)[:300]}"
        print(f"fit failed with the default cross-device ops ({why}); retrying: ring", flush=True)
        os.execv(
            sys.executable,
            [
                sys.executable,
                "-m",
                __spec__.name,
                *(argv if argv is not None else sys.argv[1:]),
                "--cross-device-ops",
                "collective_ring",
                "--after-failure",
                why,
            ],
        )
    report = kdt.Report.load(log_dir)
    report.to_csv(args.out / "csv")
    findings, notes = compare(report, args.replicas, parameter_bytes)
    windows = report.windows
    notes.insert(
        0,
        "windows: "
        + "; ".join(
            f"{row.status}" + (f" ({row.reason})" if isinstance(row.reason, str) else "")
            for row in windows.itertuples()
        ),
    )
    traces = [Path(t) for t in windows.get("trace", []) if isinstance(t, str)]
    if args.after_failure:
        notes.insert(0, f"MirroredStrategy's default failed here ({args.after_failure}): ring used")
    if args.replicas > 1:
        kernels = sorted({k for trace in traces for k in nccl_kernels(log_dir / trace)})
        notes.append(
            "NCCL: "
            + (f"used ({', '.join(kernels[:4])})" if kernels else "no NCCL kernel in the capture")
        )
    write_result(
        args.out,
        {
            "status": "ok",
            "summary": plan,
            "findings": findings,
            "notes": [*notes, f"raw: {log_dir.name}/ (records, traces), csv/ (Report frames)"],
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
