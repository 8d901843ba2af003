"""The one make_dataset contract of tune_allreduce and find_per_replica_batch, and what a
trial that ends without a result is said to have died of."""

import textwrap

import numpy as np
import pytest

from keras_dp_tools.tools.tuning.allreduce import tune_allreduce
from keras_dp_tools.tools.tuning.batch_finder import find_per_replica_batch
from keras_dp_tools.tools.tuning.child import ContractError, dataset_spelling, trial_dataset
from tests.helpers import REPO
from tests.helpers.doc_blocks import python_block, run_example

SCRIPT = REPO / "examples" / "tune_allreduce_script.py"
MIB = 2**20


def by_global_batch(global_batch):
    import tensorflow as tf

    return tf.data.Dataset.range(100).batch(global_batch)


def by_strategy(strategy):  # global batches of its own choosing: 10, whatever is asked
    import tensorflow as tf

    return tf.data.Dataset.range(100).batch(10)


def by_batch_size(batch_size):
    return by_global_batch(batch_size)


def by_nothing():
    return by_strategy(None)


def by_examples(examples):  # neither spelling
    raise AssertionError("the contract is checked before make_dataset is called")


def first_batch(dataset) -> list[int]:
    return next(iter(dataset)).numpy().tolist()


@pytest.mark.parametrize(
    ("make_dataset", "spelling"),
    [
        (by_global_batch, "global_batch"),
        (by_batch_size, "global_batch"),
        (by_strategy, "strategy"),
        (by_nothing, "strategy"),
    ],
)
def test_each_spelling_gives_batches_of_the_asked_size(make_dataset, spelling, tf, strategy1):
    assert dataset_spelling(make_dataset) == spelling

    # Asked for 12 examples a step, both spellings give the first 12 examples.
    assert first_batch(trial_dataset(make_dataset, strategy1, 12)) == list(range(12))


def test_without_a_batch_the_strategy_spelling_keeps_its_own_batches(tf, strategy1):
    assert first_batch(trial_dataset(by_strategy, strategy1)) == list(range(10))


def test_a_partial_batch_is_never_trained_so_each_step_takes_the_global_batch(tf, strategy1):
    # by_global_batch(16) batches 100 examples without drop_remainder: 6 x 16, then 4.
    repeated = trial_dataset(by_global_batch, strategy1, 16).repeat()
    batches = [batch.numpy().tolist() for batch in repeated.take(8)]
    assert [len(batch) for batch in batches] == [16] * 8  # never the 4 at an epoch's end
    assert batches[5][-1] == 95 and batches[6][0] == 0  # 96..99 dropped, then again


def test_batches_of_another_size_than_the_global_batch_are_refused(tf, strategy1):
    def fixed_eights(global_batch):  # ignores the batch it is asked for
        return tf.data.Dataset.range(100).batch(8, drop_remainder=True)

    message = r"batches of 8 examples.*asked for global_batch=16.*batch\(global_batch"
    with pytest.raises(ContractError, match=message):
        trial_dataset(fixed_eights, strategy1, 16)
    # What the strategy spelling chooses is re-batched, not refused.
    assert first_batch(trial_dataset(by_strategy, strategy1, 16)) == list(range(16))


def test_a_dataset_that_is_not_a_tf_data_dataset_is_refused(tf, strategy1):
    def by_arrays(global_batch):
        return np.zeros((global_batch, 2))

    with pytest.raises(TypeError, match="returned ndarray"):
        trial_dataset(by_arrays, strategy1, 4)


def test_neither_spelling_is_refused_by_both_helpers_before_any_trial(tmp_path):
    with pytest.raises(TypeError, match=r"received make_dataset\(examples\)"):
        find_per_replica_batch(f"{SCRIPT}:build_model", by_examples, 2, max_memory_bytes=MIB)
    with pytest.raises(TypeError, match=r"received make_dataset\(examples\)"):
        tune_allreduce(f"{SCRIPT}:build_model", by_examples, devices=2, log_dir=tmp_path)
    assert not any(tmp_path.iterdir())  # no trial started


def test_tune_allreduce_asks_for_per_replica_batch_with_the_global_batch_spelling(tmp_path):
    with pytest.raises(TypeError, match="per_replica_batch="):
        tune_allreduce(f"{SCRIPT}:build_model", by_global_batch, devices=2, log_dir=tmp_path)


def test_the_docs_example_of_a_make_dataset_of_neither_spelling_runs(tmp_path):
    code = python_block("docs/tuning.md", "## How your functions reach the trial processes")
    out = run_example(code, tmp_path)

    assert "received make_dataset(examples)" in out, out


TRAINS_AT_IMPORT = """
    import numpy as np
    import keras

    import keras_dp_tools as kdt


    def build_model():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        return model


    def make_dataset(global_batch):
        import tensorflow as tf

        x = np.ones((64, 4), "float32")
        return tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(global_batch)


    build_model().fit(np.ones((8, 4)), np.ones((8, 1)), verbose=0)  # training at import
    """


@pytest.mark.slow
def test_a_script_that_tunes_at_import_is_told_to_use_a_main_guard(tmp_path):
    script = tmp_path / "train.py"
    tuning = f"""
    kdt.find_per_replica_batch(
        build_model, make_dataset, 2, max_memory_bytes=2**30, max_batch=1,
        log_dir={str(tmp_path / "logs")!r},
    )
    """
    script.write_text(textwrap.dedent(TRAINS_AT_IMPORT) + textwrap.dedent(tuning))

    # As `python train.py` would: the trial imports train.py, which tunes again there.
    with pytest.raises(TypeError, match="if __name__ == '__main__'") as raised:
        find_per_replica_batch(
            f"{script}:build_model", f"{script}:make_dataset", 2, max_memory_bytes=2**30
        )
    assert "cuInit" not in str(raised.value)


@pytest.mark.slow
def test_a_trial_that_exits_without_a_result_names_the_cause_not_tensorflows_last_line(
    tmp_path,
):
    script = tmp_path / "train.py"
    ending = "\n    raise SystemExit(0)  # the end of a script run as a program\n"
    script.write_text(textwrap.dedent(TRAINS_AT_IMPORT + ending))

    found = find_per_replica_batch(
        f"{script}:build_model",
        f"{script}:make_dataset",
        2,
        max_memory_bytes=2**30,
        max_batch=1,
        log_dir=tmp_path / "logs",
        progress=None,
    )

    reason = found.trials["reason"].iloc[0]
    assert found.per_replica_batch is None
    assert "exited without a result" in reason and "if __name__ == '__main__'" in reason
    assert "status 0" in reason and "cuInit" not in reason
    assert str(tmp_path / "logs") in reason  # where its whole output is
    assert "memory" not in found.note.replace("than memory", "")  # it did not run out
