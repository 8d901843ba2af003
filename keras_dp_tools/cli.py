"""The ``keras-dp`` command (also ``python -m keras_dp_tools``)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import keras_dp_tools


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a positive integer, received {text!r}"
        ) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, received {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="keras-dp",
        description="Profile and tune data-parallel Keras training.",
    )
    parser.add_argument("--version", action="version", version=keras_dp_tools.__version__)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser(
        "demo",
        help="train a small CNN data-parallel on synthetic data and record it",
        description="Train a small CNN with MirroredStrategy on synthetic images (GPUs if "
        "present, else the CPU split into logical devices), with keras_dp_tools callbacks, "
        "then print a summary and where to look next.",
    )
    demo.add_argument(
        "--replicas",
        type=positive_int,
        default=None,
        help="replicas: GPUs to use, or logical CPU devices without GPUs "
        "(default: all GPUs, or KERAS_DP_REPLICAS, or 4 CPU devices)",
    )
    demo.add_argument("--steps", type=positive_int, default=300, help="training steps (300)")
    demo.add_argument("--epochs", type=positive_int, default=3, help="epochs (3)")
    demo.add_argument(
        "--per-replica-batch", type=positive_int, default=16, help="examples per replica (16)"
    )
    demo.add_argument(
        "--log-dir", type=Path, default=None, help="run folder (runs/demo-<timestamp>)"
    )
    demo.set_defaults(handler=run_demo_command)
    return parser


def run_demo_command(args: argparse.Namespace) -> int:
    # TensorFlow's C++ info lines (CUDA probing on a CPU machine) bury the demo's output.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from keras_dp_tools import demo

    log_dir = args.log_dir or demo.default_log_dir()
    report = demo.run_demo(
        replicas=args.replicas,
        steps=args.steps,
        epochs=args.epochs,
        per_replica_batch=args.per_replica_batch,
        log_dir=log_dir,
    )
    demo.print_next_steps(report, log_dir)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except (ValueError, RuntimeError, FileNotFoundError) as error:
        print(f"keras-dp {args.command}: error: {error}", file=sys.stderr)
        return 2
