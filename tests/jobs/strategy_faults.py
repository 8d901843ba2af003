"""Functions for compare_strategies' bad-input test, imported by its trial processes:
a build_model that raises under CentralStorageStrategy, a make_dataset that never
returns for a lone replica (one_device), one that breaks the contract, and one whose last
batch is short. Otherwise the example script's model and data."""

import time
from pathlib import Path

from keras_dp_tools.tools.tuning.child import load_function

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "compare_strategies_script.py"
CENTRAL_STORAGE_ERROR = "this model refuses central storage"


def build_model(strategy):
    if "CentralStorage" in type(strategy).__name__:
        raise RuntimeError(CENTRAL_STORAGE_ERROR)
    return load_function(f"{EXAMPLE}:build_model")()


def make_dataset(strategy):
    if strategy.num_replicas_in_sync == 1:
        time.sleep(3600)  # hangs: the comparison must stop it at its timeout
    return load_function(f"{EXAMPLE}:make_dataset")(16 * strategy.num_replicas_in_sync)


def make_dataset_of_examples(examples):  # neither global_batch nor strategy
    raise AssertionError("never called: the contract is checked first")


def make_dataset_with_a_remainder(global_batch):
    """The example's data, batched without drop_remainder: 8 whole batches and one of 3."""
    import numpy as np
    import tensorflow as tf

    x = np.random.default_rng(0).normal(size=(global_batch * 8 + 3, 64)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1, keepdims=True))).batch(global_batch)
