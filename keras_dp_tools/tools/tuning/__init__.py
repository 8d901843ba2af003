"""Tuning by measurement: the all-reduce implementation (``tune_allreduce``) and the
per-replica batch (``find_per_replica_batch``), each trial in its own process."""
