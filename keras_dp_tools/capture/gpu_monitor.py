"""GpuMonitor: GPU utilization, memory, power and clocks through NVML, and host CPU usage."""

from __future__ import annotations

import queue
import re
import time

from keras_dp_tools.capture.base import DataParallelCallback, MeasurementWarning
from keras_dp_tools.capture.monitor.host_usage import HostCpuMeter
from keras_dp_tools.capture.monitor.nvml_reader import (
    READING_FIELDS,
    NvmlReader,
    NvmlUnavailable,
    visible_nvml_indices,
)
from keras_dp_tools.capture.monitor.sampler import Sampler
from keras_dp_tools.capture.recorder import Recorder
from keras_dp_tools.capture.run_info import global_step, strategy_devices
from keras_dp_tools.common.warn import warn, warn_without_raising
from keras_dp_tools.records.contract import gpu_ordinal

_PCI_BUS_ID = re.compile(r"pci bus id: ([0-9a-fA-F:.]+)")
# Per-GPU TensorBoard scalars: reading field -> tag "gpu/<i>/<tag>". Each tag is its
# field's name but utilization's, which is the documented "gpu/<i>/util".
SCALAR_FIELDS = {"util_gpu": "util"} | {
    field: field for field in ("mem_used_gb", "power_w", "sm_clock_mhz", "sm_activity")
}
SCALAR_SECONDS = 2.0  # how often samples go to TensorBoard (records get every one)
# Least time between host CPU readings: each reads /proc/stat on the training thread
# (~0.1-0.2 ms), which at the GPU interval (0.1 s) would cost 0.1-0.2% of every step.
CPU_SECONDS = 1.0
# Most time between two heartbeats, as a share of the sampler's idle timeout.
HEARTBEAT_SHARE = 0.25


def gpu_ordinals(devices: list[str]) -> list[int]:
    """TF GPU ordinals among a strategy's devices, in replica order.

    Args:
        devices: the strategy's device names (``/gpu:1``, ``.../device:GPU:1``, ...).

    Returns:
        The GPUs' ordinals; devices that are no GPU are left out.

    Example:

    >>> from keras_dp_tools.capture.gpu_monitor import gpu_ordinals
    >>> gpu_ordinals(["/job:localhost/replica:0/task:0/device:GPU:1", "/gpu:0", "/cpu:0"])
    [1, 0]
    """
    return [ordinal for ordinal in map(gpu_ordinal, devices) if ordinal is not None]


def _pci_bus_ids(ordinals: list[int]) -> list[str] | None:
    """PCI bus ids TensorFlow reports for its GPUs (None if it does not say)."""
    from tensorflow.python.client import device_lib

    found = {}
    for device in device_lib.list_local_devices():
        ordinal = gpu_ordinal(device.name)
        bus = _PCI_BUS_ID.search(device.physical_device_desc or "")
        if ordinal is not None and bus:
            found[ordinal] = bus.group(1)
    ids = [found.get(ordinal) for ordinal in ordinals]
    return ids if all(ids) else None


class NoGpuWarning(UserWarning):
    """GpuMonitor found no GPU to read (none visible, no NVML, or a strategy on CPU
    devices); it records the CPU usage only.

    Example:

    ```python
    import warnings
    import keras_dp_tools as kdt

    warnings.simplefilter("ignore", kdt.NoGpuWarning)  # a CPU-only run, on purpose
    ```
    """


class GpuMonitor(DataParallelCallback):
    """Samples the strategy's GPUs through NVML in a background thread, and host CPU usage.

    Every ``interval`` seconds it records, per GPU: utilization (``util_gpu``: the share
    of time *any* kernel ran, not how many SMs were busy; ``util_memory``), memory used
    and total, power, SM clock, temperature, and where the GPU supports it GPM SM
    activity and occupancy (Hopper and newer) and NVLink throughput. The driver's
    timestamped utilization buffer (``nvmlDeviceGetSamples``) is drained too, for a
    denser utilization series. GPUs are matched to TensorFlow's by PCI bus id, so
    ``CUDA_VISIBLE_DEVICES`` is honoured.

    Process and machine CPU usage are recorded on the training thread every second
    (every ``interval`` if longer) and at each epoch end, so CPU-only runs show how
    busy the machine was. Without a GPU, without
    the NVIDIA driver, or when NVML fails, it logs one info line, starts no thread,
    and writes a ``gpu_status`` record saying why GPU data is absent.

    Readings go to the records (``gpu_sample``, ``cpu_sample``; ``kdt.Report.gpu``,
    ``Report.cpu``, and ``gpu_util_mean`` per step in ``Report.steps``) and to
    TensorBoard scalars ``gpu/<i>/util``, ``gpu/<i>/mem_used_gb``, ...,
    ``host/cpu_process_percent`` and ``host/cpu_system_percent`` (both in % of all the
    host's cores; the records count 100% per core).

    Example:

    ```python
    import keras_dp_tools as kdt

    model.fit(dataset, epochs=3, callbacks=[kdt.GpuMonitor("runs/exp1", interval=0.2)])
    report = kdt.Report.load("runs/exp1")
    print(report.gpu.groupby("gpu")["util_gpu"].mean())   # empty without GPUs
    print(report.runs[["gpu_available", "gpu_reason"]])
    ```

    Args:
        log_dir: run folder, as for the other callbacks.
        interval: seconds between readings (NVML refreshes utilization every 1/6 s to
            1 s depending on the GPU; 0.1 s catches every refresh).
        tensorboard: also write TensorBoard scalars (every couple of seconds).
        source: where readings come from; default ``NvmlReader`` for the strategy's
            GPUs. Anything with ``open() -> devices``, ``read() -> list[dict]`` and
            ``close()`` works, e.g. ``keras_dp_tools.capture.monitor.replay.ReplayReader``.
        idle_timeout: seconds without a training step after which the sampler thread
            stops (a ``fit`` that raised never says so); the next step restarts it.
    """

    def __init__(
        self,
        log_dir,
        interval: float = 0.1,
        tensorboard: bool = True,
        source=None,
        idle_timeout: float = 120.0,
    ):
        super().__init__()
        if not isinstance(interval, (int, float)) or not 0.01 <= interval <= 3600:
            raise ValueError(
                f"interval must be a number of seconds from 0.01 to 3600, received {interval!r}."
            )
        self.log_dir = log_dir
        self.interval = float(interval)
        self.tensorboard = tensorboard
        self.source = source
        self.idle_timeout = idle_timeout
        self.devices = []
        self._reader = None
        self._sampler: Sampler | None = None
        self._cpu: HostCpuMeter | None = None
        self._last_cpu = 0.0
        self._last_scalars = 0.0
        # The batch hook does its chores (heartbeat, CPU reading, scalars) at most this
        # often, and nothing else: a step costs it one clock read and one comparison.
        self._chore_seconds = min(max(self.interval, CPU_SECONDS), SCALAR_SECONDS)
        if idle_timeout is not None:
            self._chore_seconds = min(self._chore_seconds, HEARTBEAT_SHARE * idle_timeout)
        self._next_chores = 0.0
        # The global step of the epoch's first call and the current call's batch: the
        # TensorBoard points' step without reading optimizer.iterations (~0.7 ms each).
        self._epoch_first_step = 0
        self._batch: int | None = None
        self._pending: queue.SimpleQueue = queue.SimpleQueue()

    # -- hooks ---------------------------------------------------------------

    def on_train_begin(self, logs=None):
        self._close()
        strategy = self.model.distribute_strategy
        self._recorder = Recorder.for_fit(self.log_dir, self.model)
        self._batch = None
        self._cpu = HostCpuMeter()
        self._last_cpu = self._last_scalars = now = time.monotonic()
        self._next_chores = now + self._chore_seconds
        self._start_gpu_sampling(strategy_devices(strategy))

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_first_step, self._batch = self._step(), 0

    def on_train_batch_begin(self, batch, logs=None):
        # One batch hook, not two: each hook call costs ~10 µs of the training thread.
        self._batch = batch
        now = time.monotonic()
        if now >= self._next_chores:
            self._next_chores = now + self._chore_seconds
            self._chores(now)

    def _chores(self, now: float) -> None:
        if self._sampler is not None:
            self._sampler.heartbeat()
            self._sampler.start()  # after an idle pause
        if now - self._last_cpu >= max(self.interval, CPU_SECONDS):
            self._last_cpu = now
            self._record_cpu()
        if now - self._last_scalars >= SCALAR_SECONDS:
            self._last_scalars = now
            self._drain_scalars()

    def on_test_begin(self, logs=None):
        if self._sampler is not None:  # validation: training is alive, just not stepping
            self._sampler.idle_timeout = None

    def on_test_end(self, logs=None):
        if self._sampler is not None:
            self._sampler.idle_timeout = self.idle_timeout
            self._sampler.heartbeat()

    def on_epoch_end(self, epoch, logs=None):
        self._batch = None  # the step from the optimizer: the epoch's last call is done
        self._record_cpu()
        self._drain_scalars()
        self._recorder.flush()

    def on_train_end(self, logs=None):
        self._close()

    def _on_failure(self):
        self._close()

    # -- GPU ------------------------------------------------------------------

    def _start_gpu_sampling(self, devices: list[str]) -> None:
        ordinals = gpu_ordinals(devices)
        reader = self.source
        if reader is None:
            if not ordinals:
                on = f"devices: {', '.join(devices)}" if devices else "the default strategy"
                self._no_gpu_data(f"the strategy uses no GPU ({on})")
                return
            try:
                reader = NvmlReader(
                    pci_bus_ids=_pci_bus_ids(ordinals),
                    identities=visible_nvml_indices(max(ordinals) + 1),
                )
                if reader.pci_bus_ids is None:  # TF did not report bus ids: trust the order
                    reader.identities = [reader.identities[ordinal] for ordinal in ordinals]
            except NvmlUnavailable as reason:
                self._no_gpu_data(str(reason))
                return
        try:
            self.devices = reader.open()
        except NvmlUnavailable as reason:
            self._no_gpu_data(str(reason))
            return
        self._reader = reader
        self._recorder.write(
            "gpu_status",
            time=time.time(),
            gpu_available=True,
            gpu_reason=None,
            gpu_names=[device.name for device in self.devices],
            gpu_pci_bus_ids=[device.pci_bus_id for device in self.devices],
        )
        self._sampler = Sampler(
            reader,
            self._record_gpu,
            self.interval,
            idle_timeout=self.idle_timeout,
            on_error=self._sampler_failed,
        )
        self._sampler.start()

    def _no_gpu_data(self, reason: str) -> None:
        self._recorder.write("gpu_status", time=time.time(), gpu_available=False, gpu_reason=reason)
        # A warning, not a log line: Python's default logging hides INFO, and a user who
        # added a GPU monitor should learn that it has nothing to read. Warnings made
        # errors must not stop the CPU readings: the record above says it too.
        warn_without_raising(
            f"keras_dp_tools GpuMonitor: no GPU data ({reason}); recording CPU usage only.",
            NoGpuWarning,
        )

    def _record_gpu(self, readings: list[dict]) -> None:
        """Runs in the sampler thread: records are thread-safe; scalars wait for the
        training thread (TensorFlow summaries are written there)."""
        for reading in readings:
            fields = {name: reading.get(name) for name in READING_FIELDS if name in reading}
            self._recorder.write(
                "gpu_sample",
                time=reading["time"],
                gpu=reading["gpu"],
                sampling=reading.get("sampling", "poll"),
                **fields,
            )
            if self.tensorboard and reading.get("sampling", "poll") == "poll":
                self._pending.put(reading)

    def _sampler_failed(self, error: BaseException) -> None:
        message = (
            f"GpuMonitor stopped reading the GPUs after an error: {type(error).__name__}: "
            f"{error}. Training continues; CPU usage is still recorded."
        )
        warn(message, MeasurementWarning)
        self._recorder.write(
            "gpu_status", time=time.time(), gpu_available=False, gpu_reason=message
        )

    def _step(self) -> int:
        """The global step the current (or next) call starts at: the points' step."""
        if self._batch is not None:
            return self._epoch_first_step + self._batch
        return global_step(self.model) or 0

    def _drain_scalars(self) -> None:
        if self._pending.empty():
            return
        step = self._step()
        while True:
            try:
                reading = self._pending.get_nowait()
            except queue.Empty:
                return
            values = {
                f"gpu/{reading['gpu']}/{tag}": reading.get(field)
                for field, tag in SCALAR_FIELDS.items()
            }
            self._recorder.scalars(step, values)

    # -- CPU ------------------------------------------------------------------

    def _record_cpu(self) -> None:
        usage = self._cpu.read()
        self._recorder.write("cpu_sample", **usage)
        if self.tensorboard:
            # The records keep 100% = one core; TensorBoard gets one 0-100 scale.
            process = usage["process_cpu_percent"]
            self._recorder.scalars(
                self._step(),
                {
                    "host/cpu_process_percent": (
                        None if process is None else process / usage["cpu_count"]
                    ),
                    "host/cpu_system_percent": usage["system_cpu_percent"],
                },
            )

    # -- cleanup ----------------------------------------------------------------

    def _close(self) -> None:
        if self._sampler is not None:
            self._sampler.stop()
            self._sampler = None
        if self._reader is not None:
            try:
                self._reader.close()
            finally:
                self._reader = None
        if self._recorder is not None:
            try:
                self._drain_scalars()
            finally:
                self._release_recorder()
