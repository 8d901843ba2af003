"""Layer 2, setup: what you call before training: devices (``mirrored_strategy``), the
global batch and learning rate for a replica count, warm-up schedules.

May import: ``common``, ``records``.
"""
