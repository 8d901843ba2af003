"""Layer 3, checks: is the batch scaled by the replica count? At run time
(``check_batching``, used by the ``BatchScalingCheck`` callback) and statically in the
user's source (``lint``). And does ``fit`` train data-parallel at all
(``data_parallelism``)?

May import: ``common``, ``records``, ``setup``.
"""
