"""Child process of ``find_per_replica_batch``: train a few steps at one batch size.

Started by ``keras_dp_tools.tools.tuning.batch_finder`` (see ``child.py`` for the protocol).
On CPU the memory the trial takes is the growth of this process's resident memory
from just before the model is built: a watchdog samples it every 10 ms and ends
the process (exit status ``OVER_CEILING``) as soon as it crosses the ceiling, so a
blow-up never reaches the machine's limit; the kernel's peak (``ru_maxrss``) catches
what fell between two samples, when it rose after the baseline (TensorFlow's start-up
can leave a higher peak behind, which is not the trial's). On GPUs it is
TensorFlow's peak allocation per GPU, and an out-of-memory error ends the trial.
"""

from __future__ import annotations

import os
import resource
import threading
import time

from keras_dp_tools.tools.tuning.child import call_flexibly, load_function, serve, trial_dataset

OVER_CEILING = 86
_PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes() -> int:
    """This process's resident memory now, in bytes (Linux: ``/proc/self/statm``)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE


def peak_resident_bytes() -> int:
    """This process's peak resident memory so far, in bytes (the kernel's count)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


class _Watchdog:
    """Samples resident memory every ``interval_s``: keeps the peak since ``baseline``
    and ends the process when the growth crosses ``ceiling``."""

    def __init__(self, ceiling: int | None, interval_s: float = 0.01):
        self.baseline = resident_bytes()
        # The kernel's peak so far: if it rises later, the new peak came after baseline.
        self._kernel_peak_before = peak_resident_bytes()
        self.sampled_peak = self.baseline
        self.ceiling = ceiling
        self.interval_s = interval_s
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while True:
            now = resident_bytes()
            self.sampled_peak = max(self.sampled_peak, now)
            if self.ceiling is not None and now - self.baseline > self.ceiling:
                os._exit(OVER_CEILING)  # no clean-up: the point is to stop growing now
            time.sleep(self.interval_s)

    def growth(self) -> int:
        """Peak resident memory since the baseline, minus the baseline."""
        kernel_peak = peak_resident_bytes()
        peak = kernel_peak if kernel_peak > self._kernel_peak_before else 0
        return max(peak, self.sampled_peak, resident_bytes()) - self.baseline


def _learning_rate(model):
    try:
        return float(model.optimizer.learning_rate.numpy())
    except (AttributeError, TypeError, ValueError):  # a schedule, or no optimizer
        return None


def _trial(spec: dict) -> dict:
    import tensorflow as tf

    from keras_dp_tools.setup.devices import configure_devices, gpu_ordinal

    if spec["cpu_devices"]:
        configure_devices(spec["cpu_devices"])
    strategy = tf.distribute.MirroredStrategy(spec["devices"])
    gpus = [gpu_ordinal(d) for d in spec["devices"] if gpu_ordinal(d) is not None]
    tf.constant(0.0)  # devices initialised: their fixed cost is in the baseline
    ceiling = spec["max_memory_bytes"]
    watchdog = None if gpus else _Watchdog(ceiling)
    global_batch = spec["per_replica_batch"] * strategy.num_replicas_in_sync
    try:
        with strategy.scope():
            model = call_flexibly(load_function(spec["build_model"]), strategy)
        dataset = trial_dataset(load_function(spec["make_dataset"]), strategy, global_batch)
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
        peak = watchdog.growth()
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
