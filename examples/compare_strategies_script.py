"""A script for ``keras-dp compare-strategies`` (and ``kdt.compare_strategies``).

Each candidate's processes import this file and call its functions, the model and data
of ``tune_allreduce_script.py``:

* ``build_model()``: a compiled Keras model; called inside the strategy's scope. It is
  built with ``tf.keras``: Keras 3 in most candidates, tf_keras under
  ``multi_worker_mirrored`` and ``parameter_server`` (their processes run with
  ``TF_USE_LEGACY_KERAS=1``: Keras 3's fit does not run under them).
* ``make_dataset(global_batch)``: a ``tf.data.Dataset`` of batches of ``global_batch``
  examples (the per-replica batch times the candidate's replicas).

Nothing runs at import; run the command instead:

    keras-dp compare-strategies examples/compare_strategies_script.py --steps 12
"""

# The trial adds this file's folder to the path before importing it.
from tune_allreduce_script import build_model, make_dataset

__all__ = ["build_model", "make_dataset"]
