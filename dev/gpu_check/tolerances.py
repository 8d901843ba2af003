"""The tolerances the GPU check compares against, in one place (docs/gpu_monitor.md
says what each means). Standard library only: the NVML comparison runs without TF."""

from __future__ import annotations

# NVML (what GpuMonitor reads) against nvidia-smi sampled at the same moments: the
# largest accepted difference between the two means over the paired readings, in our
# units.
# Utilization and power are averages over windows that differ by the time between the
# two reads, so they get loose tolerances; memory and clocks are instantaneous.
NVML_VS_SMI = {
    "util_gpu": 15.0,  # percent
    "util_memory": 15.0,  # percent
    "mem_used_gb": 0.25,  # GiB
    "mem_total_gb": 0.01,  # GiB
    "power_w": 25.0,  # W
    "sm_clock_mhz": 100.0,  # MHz
    "temperature_c": 3.0,  # Celsius
}

# Our breakdown against XProf's numbers on the same capture, relative to XProf's.
COMPUTE_VS_XPROF = 0.10  # median device compute per step vs xprof_device_compute_ms
ALLREDUCE_VS_XPROF = 0.25  # median all-reduce per step vs xprof_collectives_ms
# All-reduced bytes per step against trainable parameters x 4 (float32 gradients),
# relative: the gradients are the whole payload, so only rounding is allowed.
BYTES_VS_PARAMETERS = 0.05
# One replica has nothing to all-reduce: any all-reduce time is a misclassified kernel.
SINGLE_REPLICA_ALLREDUCE_MS = 0.0
# Our step time (the step markers' span) against XProf's step time, relative.
STEP_VS_XPROF = 0.10
