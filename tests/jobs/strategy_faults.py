"""Functions for compare_strategies' bad-input test, imported by its trial processes:
a build_model that raises under CentralStorageStrategy, a make_dataset that never
returns for a lone replica (one_device), and one that breaks the contract. Otherwise the
example script's model and data."""

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
