"""Sampling what the hardware does during training: NVML GPU readings, host CPU usage.

Standard library and ``pynvml`` only: importable (and the NVML reader usable) on a GPU
box without TensorFlow or pandas.
"""
