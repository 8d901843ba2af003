"""Child process of ``find_per_replica_batch``: train a few steps at one batch size.

Started by ``keras_dp_tools.tuning.batch_finder`` (see ``child.py`` for the protocol).
On CPU the memory the trial takes is the growth of this process's resident memory
from just before the model is built: a watchdog ends the process (exit status
``OVER_CEILING``) as soon as it crosses the ceiling, so a blow-up never reaches the
machine's limit, and the kernel's peak (``ru_maxrss``) catches what fell between
two readings. On GPUs it is TensorFlow's peak allocation per GPU, and an
out-of-memory error ends the trial.
"""

from __future__ import annotations

import os
import resource
import threading
import time

from keras_dp_tools.tuning.child import call_flexibly, load_function, serve

OVER_CEILING = 86
_PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE


def peak_resident_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _watch(baseline: int, ceiling: int, interval_s: float = 0.01) -> None:
    while True:
        if resident_bytes() - baseline > ceiling:
            os._exit(OVER_CEILING)  # no clean-up: the point is to stop growing now
        time.sleep(interval_s)


def _learning_rate(model):
    try:
        return float(model.optimizer.learning_rate.numpy())
    except (AttributeError, TypeError, ValueError):  # a schedule, or no optimizer
        return None


def _trial(spec: dict) -> dict:
    import tensorflow as tf

    from keras_dp_tools.devices import configure_devices, gpu_ordinal

    if spec["cpu_devices"]:
        configure_devices(spec["cpu_devices"])
    strategy = tf.distribute.MirroredStrategy(spec["devices"])
    gpus = [gpu_ordinal(d) for d in spec["devices"] if gpu_ordinal(d) is not None]
    tf.constant(0.0)  # devices initialised: their fixed cost is in the baseline
    baseline = resident_bytes()
    ceiling = spec["max_memory_bytes"]
    if ceiling is not None and not gpus:
        threading.Thread(target=_watch, args=(baseline, ceiling), daemon=True).start()
    global_batch = spec["per_replica_batch"] * strategy.num_replicas_in_sync
    try:
        with strategy.scope():
            model = call_flexibly(load_function(spec["build_model"]), strategy)
        dataset = load_function(spec["make_dataset"])(global_batch)
        started = time.perf_counter()
        model.fit(dataset.repeat(), steps_per_epoch=spec["steps"], epochs=1, verbose=0)
        seconds = time.perf_counter() - started
    except tf.errors.ResourceExhaustedError as error:
        return {"fits": False, "reason": f"out of memory: {str(error).splitlines()[0][:300]}"}
    if gpus:
        peak = max(
            tf.config.experimental.get_memory_info(f"GPU:{ordinal}")["peak"] for ordinal in gpus
        )
    else:
        peak = peak_resident_bytes() - baseline
    fits = ceiling is None or peak <= ceiling
    return {
        "fits": fits,
        "peak_bytes": peak,
        "seconds": seconds,
        "learning_rate": _learning_rate(model),
        "reason": None if fits else f"peak {peak / 2**20:.0f} MiB is over the ceiling",
    }


if __name__ == "__main__":
    serve(_trial)
