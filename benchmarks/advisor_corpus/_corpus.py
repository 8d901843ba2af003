"""Shared set-up for the advisor corpus's reproductions (no analysis, no advice).

Each ``repro_*.py`` script calls :func:`start` first: it reads ``--log-dir`` and
``--replicas`` and splits the CPU into logical devices before TensorFlow starts, then
trains. :func:`fit_callbacks` is ``kdt.callbacks`` with the advisor switched off
(``advise=False``): the corpus is labelled blind, so no script may run the advisor.
"""

import argparse
import os
from dataclasses import dataclass


@dataclass
class Run:
    """What a reproduction needs: the strategy, where to write, the replica count."""

    strategy: object
    log_dir: str
    replicas: int
    training_loop: bool = False  # --training-loop: measure a custom loop (kdt.TrainingLoop)


def start(description):
    """Parses the command line and builds the strategy (before TensorFlow starts).

    Args:
        description: the script's docstring, shown by ``--help``.

    Returns:
        A :class:`Run`.
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--log-dir", required=True, help="run folder for the records")
    parser.add_argument(
        "--replicas",
        type=int,
        default=int(os.environ.get("KERAS_DP_REPLICAS", "4")),
        help="logical CPU devices (replicas); default 4 or $KERAS_DP_REPLICAS",
    )
    parser.add_argument(
        "--training-loop",
        action="store_true",
        help="a custom loop's steps are measured with kdt.TrainingLoop (no advice)",
    )
    args = parser.parse_args()
    import keras_dp_tools as kdt

    strategy = kdt.mirrored_strategy(args.replicas)
    os.makedirs(args.log_dir, exist_ok=True)
    return Run(
        strategy=strategy,
        log_dir=args.log_dir,
        replicas=args.replicas,
        training_loop=args.training_loop,
    )


def fit_callbacks(run, **kwargs):
    """``kdt.callbacks`` for ``fit`` without the advisor (the corpus stays blind)."""
    import keras_dp_tools as kdt

    kwargs.setdefault("profile_start_step", 5)
    return kdt.callbacks(run.log_dir, advise=False, **kwargs)


def training_loop(run, model, **kwargs):
    """A custom loop's ``kdt.TrainingLoop`` without the advisor when the script runs
    with ``--training-loop``, else a stand-in that measures nothing: ``with
    training_loop(run, model) as loop:`` and ``with loop.step():`` either way."""
    if not run.training_loop:
        return _Unmeasured()
    import keras_dp_tools as kdt

    kwargs.setdefault("profile_start_step", 5)
    return kdt.TrainingLoop(run.log_dir, run.strategy, model, advise=False, **kwargs)


class _Unmeasured:
    """``kdt.TrainingLoop``'s shape, measuring nothing (the scripts' default)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return None

    def step(self):
        import contextlib

        return contextlib.nullcontext()


def save_loop_times(run, step_seconds):
    """Writes a custom loop's step times (not keras_dp records) beside the run.

    ``kdt.callbacks`` cannot see a ``strategy.run`` loop, so these scripts write no
    ``keras_dp/`` records unless run with ``--training-loop`` (``kdt.TrainingLoop``);
    the wall time per step, measured here with ``time.perf_counter`` around each call,
    is kept for comparison.
    """
    import json

    path = os.path.join(run.log_dir, "loop_step_seconds.json")
    with open(path, "w") as handle:
        json.dump({"replicas": run.replicas, "step_seconds": step_seconds}, handle)
    return path


def strategy_dependent_gru(units, name=None):
    """A GRU whose kernel depends on the replica count, as the cuDNN fallback did.

    On a GPU, TensorFlow 2.0-2.2 ran Keras's GRU on its generic kernel instead of cuDNN
    when the model was built under MirroredStrategy (tensorflow/tensorflow#40421,
    #33809). A CPU has no cuDNN kernel, so the choice is emulated: with one replica the
    layer is ``keras.layers.GRU`` (the backend's fused path), with more it is
    ``keras.layers.RNN(GRUCell)`` (the generic per-time-step loop, ~3x the compute per
    example on this machine). Same maths, same weights' shapes.
    """
    import keras
    import tensorflow as tf

    if tf.distribute.get_strategy().num_replicas_in_sync > 1:
        return keras.layers.RNN(keras.layers.GRUCell(units), name=name)
    return keras.layers.GRU(units, name=name)
