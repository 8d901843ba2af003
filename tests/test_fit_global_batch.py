"""The global batch read from fit's data when kdt.callbacks is not told it: real fits
under a 4-replica MirroredStrategy (logical CPUs), Keras 3 and tf_keras."""

import json
import warnings

import numpy as np
import pytest

import keras_dp_tools as kdt
from keras_dp_tools.records.writer import worker_records_path
from tests.helpers.training import GLOBAL_BATCH, dense_model, regression_data

STEPS = 7  # regression_data() holds 7 global batches of 32
PER_REPLICA = GLOBAL_BATCH // 4


def _inputs(kind, tf, strategy):
    """(fit's positional arguments, its keyword arguments) for one kind of input."""
    x, y = regression_data()

    def examples():
        return tf.data.Dataset.from_tensor_slices((x, y))

    if kind == "arrays":
        return (x, y), {"batch_size": GLOBAL_BATCH}
    if kind == "dataset_drop_remainder":
        return (examples().batch(GLOBAL_BATCH, drop_remainder=True),), {}
    if kind == "dataset":
        return (examples().batch(GLOBAL_BATCH),), {}
    if kind == "distributed_dataset":
        dataset = strategy.experimental_distribute_dataset(examples().batch(GLOBAL_BATCH))
        return (dataset,), {"steps_per_epoch": STEPS}
    if kind == "datasets_from_function":
        dataset = strategy.distribute_datasets_from_function(
            lambda context: examples().batch(PER_REPLICA, drop_remainder=True).repeat()
        )
        return (dataset,), {"steps_per_epoch": STEPS}
    if kind == "generator":  # batches of unknown size made by Python code
        spec = (tf.TensorSpec((None, 8), tf.float32), tf.TensorSpec((None, 1), tf.float32))
        batches = [(x[i : i + GLOBAL_BATCH], y[i : i + GLOBAL_BATCH]) for i in range(0, 224, 32)]
        return (tf.data.Dataset.from_generator(lambda: iter(batches), output_signature=spec),), {}
    raise AssertionError(kind)


def _fit_and_read(keras_module, tf, strategy, kind, log_dir, **options):
    model = dense_model(keras_module, strategy)
    args, kwargs = _inputs(kind, tf, strategy)
    model.fit(*args, epochs=1, verbose=0, callbacks=kdt.callbacks(log_dir, **options), **kwargs)
    lines = worker_records_path(log_dir, 0).read_text().splitlines()
    headers = [record for record in map(json.loads, lines) if record["type"] == "header"]
    assert len({header["run"] for header in headers}) == 1  # the fit's callbacks agreed
    return headers[-1], kdt.Report.load(log_dir).steps


SOURCES = {
    "arrays": "fit_batch_size",
    "dataset_drop_remainder": "dataset_shape",
    "dataset": "dataset_batch_op",
    "distributed_dataset": "dataset_batch_op",
    "datasets_from_function": "per_replica_batch_x_replicas",
}


@pytest.mark.slow
@pytest.mark.parametrize("flavour", ["keras", "tf_keras"])
@pytest.mark.parametrize("kind", list(SOURCES))
def test_the_global_batch_is_read_from_fits_data(kind, flavour, request, tf, strategy4, tmp_path):
    keras_module = request.getfixturevalue(flavour)

    run, steps = _fit_and_read(keras_module, tf, strategy4, kind, tmp_path)

    assert run["global_batch"] == GLOBAL_BATCH
    assert run["global_batch_source"] == SOURCES[kind]
    assert len(steps) == STEPS
    # 32 examples per step over the measured step time.
    assert np.allclose(steps["examples_per_s"], GLOBAL_BATCH / steps["step_ms"] * 1000)


@pytest.mark.slow
def test_a_batch_nothing_can_read_stays_empty_and_the_header_says_why(
    tf, keras, strategy4, tmp_path
):
    run, steps = _fit_and_read(keras, tf, strategy4, "generator", tmp_path)

    assert run["global_batch"] is None
    assert run["global_batch_source"].startswith("unknown: ")
    assert steps["examples_per_s"].isna().all()


@pytest.mark.slow
def test_the_argument_fills_in_where_fits_data_says_nothing(tf, tf_keras, strategy4, tmp_path):
    run, steps = _fit_and_read(
        tf_keras, tf, strategy4, "generator", tmp_path, global_batch=GLOBAL_BATCH
    )

    assert (run["global_batch"], run["global_batch_source"]) == (GLOBAL_BATCH, "argument")
    assert np.allclose(steps["examples_per_s"], GLOBAL_BATCH / steps["step_ms"] * 1000)


@pytest.mark.slow
def test_an_argument_that_contradicts_fit_is_overruled_with_a_warning(
    tf, keras, strategy4, tmp_path
):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run, steps = _fit_and_read(keras, tf, strategy4, "arrays", tmp_path, global_batch=8)

    assert (run["global_batch"], run["global_batch_source"]) == (GLOBAL_BATCH, "fit_batch_size")
    said = [str(w.message) for w in caught if "global_batch=8" in str(w.message)]
    assert len(said) == 1 and "batches of 32" in said[0]
    assert np.allclose(steps["examples_per_s"], GLOBAL_BATCH / steps["step_ms"] * 1000)


@pytest.mark.parametrize(
    ("pipeline", "expected"),
    [
        (lambda d: d.batch(32).map(lambda v: v * 2).shuffle(4).prefetch(2).repeat(), 32),
        (lambda d: d.batch(64).unbatch().batch(32).cache().take(5), 32),
        (lambda d: d.batch(64).rebatch(32), None),  # its batches are not the batch op's
        (lambda d: d.batch(64).unbatch(), None),
        (lambda d: d.batch(32, drop_remainder=True).unbatch().batch(16, drop_remainder=True), 16),
    ],
)
def test_a_pipelines_batch_is_read_from_its_last_batch_op(pipeline, expected, tf):
    from keras_dp_tools.capture.run_info import _dataset_global_batch

    batch, source = _dataset_global_batch(pipeline(tf.data.Dataset.range(1000)))

    assert batch == expected
    assert source.startswith("unknown: ") if expected is None else source.startswith("dataset_")


def test_reading_the_batch_never_serializes_the_dataset(tf, monkeypatch):
    # Serializing copies every array a dataset holds (16 s and 3 GB for 400 MB here).
    from keras_dp_tools.capture.run_info import _dataset_global_batch

    def refuse(*args, **kwargs):
        raise AssertionError("the dataset's graph was serialized")

    monkeypatch.setattr(tf.raw_ops, "DatasetToGraphV2", refuse)
    dataset = tf.data.Dataset.from_tensor_slices(np.zeros((256, 8), "float32")).batch(32)

    assert _dataset_global_batch(dataset) == (32, "dataset_batch_op")
