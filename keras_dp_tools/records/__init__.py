"""Layer 1, records: the contract between capture and analysis.

The names both sides agree on (``contract``), the columns and record fields
(``columns``), and the JSON Lines files under ``<log_dir>/keras_dp/``: how they are
written and read. Nothing here needs TensorFlow.

May import: ``common``.
"""
