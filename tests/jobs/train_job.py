"""A tiny training job for fault and multi-worker tests: run as a script.

Injects faults for real: ``--kill-at-step`` sends SIGKILL to its own process after that
step's records are written, ``--slow-ms`` sleeps before every step on ``--slow-worker``.
Under ``TF_CONFIG`` it trains with MultiWorkerMirroredStrategy (tf_keras);
``--all-workers`` profiles every worker. ``--stop-barrier`` and ``--profiler-options``
are the variants of the profiler's start and stop that benchmarks/profiler_crash.py
compares (docs/multiworker.md).
"""

import argparse
import json
import os
import signal
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("log_dir")
parser.add_argument("--keras", choices=["keras", "tf_keras"], default="tf_keras")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--steps-per-epoch", type=int, default=6)
parser.add_argument("--kill-at-step", type=int, default=None)
parser.add_argument("--kill-worker", type=int, default=None)
parser.add_argument(
    "--kill-after-analysis",
    action="store_true",
    help="before the kill, let the profiler finish and record the analyses of its closed "
    "windows (on a loaded machine one may outlast the steps to the kill)",
)
parser.add_argument("--slow-worker", type=int, default=None)
parser.add_argument("--slow-ms", type=float, default=0.0)
parser.add_argument("--profile-start-step", type=int, default=None)
parser.add_argument("--profile-every", type=int, default=None)
parser.add_argument("--profile-window", type=int, default=5, help="steps per profiler window")
parser.add_argument(
    "--all-workers",
    action="store_true",
    help="under TF_CONFIG, every worker profiles (DataParallelProfiler(all_workers=True))",
)
parser.add_argument(
    "--stop-barrier",
    action="store_true",
    help="experiment: a tiny all-reduce of all workers right before the profiler stops",
)
parser.add_argument(
    "--profiler-options",
    default=None,
    help="experiment: HOST,PYTHON,DEVICE tracer levels for tf.profiler.experimental.start",
)
parser.add_argument(
    "--validation-steps", type=int, default=0, help="evaluate this many batches each epoch"
)
parser.add_argument("--monitor", action="store_true", help="GpuMonitor too (kdt.callbacks')")
parser.add_argument("--backup", default=None)
parser.add_argument("--mirrored", type=int, default=0, help="MirroredStrategy over N CPUs")
parser.add_argument(
    "--second-fit", action="store_true", help="then a fit at half the global batch (a new run)"
)
args = parser.parse_args()

if args.keras == "tf_keras":
    os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

if args.keras == "tf_keras":
    import tf_keras as keras
else:
    import keras

import keras_dp_tools as kdt  # noqa: E402

if os.environ.get("TF_CONFIG"):
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    worker = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
elif args.mirrored:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * args.mirrored
    )
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(args.mirrored)])
    worker = 0
else:
    strategy = tf.distribute.get_strategy()
    worker = 0


class Slow(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if args.slow_ms and worker == args.slow_worker:
            time.sleep(args.slow_ms / 1000)


class Kill(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy()) - 1
        mine = args.kill_worker is None or args.kill_worker == worker
        if mine and args.kill_at_step is not None and step >= args.kill_at_step:
            if args.kill_after_analysis:
                for profiler in profilers:
                    profiler._collect(wait=True)  # closed windows only: the open one stays
            print(f"worker {worker} killing itself after step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


class ExperimentProfiler(kdt.DataParallelProfiler):
    """The profiler with the variants benchmarks/profiler_crash.py compares."""

    def _start_profiler(self, directory):
        if args.profiler_options is None:
            return super()._start_profiler(directory)
        host, python, device = (int(level) for level in args.profiler_options.split(","))
        options = tf.profiler.experimental.ProfilerOptions(
            host_tracer_level=host, python_tracer_level=python, device_tracer_level=device
        )
        tf.profiler.experimental.start(str(directory), options=options)

    def _stop_profiler(self):
        if args.stop_barrier:
            ones = strategy.run(lambda: tf.constant(1.0))
            strategy.reduce(tf.distribute.ReduceOp.SUM, ones, axis=None)
        super()._stop_profiler()


global_batch = 8 * strategy.num_replicas_in_sync
with strategy.scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
x = np.random.default_rng(0).normal(size=(global_batch * args.steps_per_epoch, 8))
x = x.astype("float32")
dataset = tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1, keepdims=True)))
dataset = dataset.batch(global_batch)
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
dataset = dataset.with_options(options)

ours = kdt.callbacks(args.log_dir, global_batch=global_batch, profile=False, monitor=args.monitor)
if args.profile_start_step is not None:
    # Where kdt.callbacks puts it (after the step timer, before the advisor); the
    # library's default for all_workers unless --all-workers says otherwise.
    profiler = ExperimentProfiler(
        args.log_dir,
        start_step=args.profile_start_step,
        window=args.profile_window,
        every=args.profile_every,
        **({"all_workers": True} if args.all_workers else {}),
    )
    ours.insert(1, profiler)
profilers = [callback for callback in ours if isinstance(callback, kdt.DataParallelProfiler)]
# The slowdown runs before our step timer starts a step; the kill after it recorded one.
callbacks = [Slow(), *ours, Kill()]
if args.backup:
    callbacks.insert(0, keras.callbacks.BackupAndRestore(args.backup))
validation = dict(validation_data=dataset, validation_steps=args.validation_steps)
model.fit(
    dataset,
    epochs=args.epochs,
    verbose=0,
    callbacks=callbacks,
    **(validation if args.validation_steps else {}),
)
if args.second_fit:  # another global batch: the recorder starts a second run
    half = global_batch // 2
    model.fit(
        dataset.unbatch().batch(half).with_options(options),
        epochs=1,
        steps_per_epoch=4,
        verbose=0,
        callbacks=kdt.callbacks(args.log_dir, global_batch=half, profile=False),
    )
print(f"worker {worker} done", flush=True)
sys.exit(0)
