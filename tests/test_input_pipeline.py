"""What feeds fit (capture.input_pipeline): pipelines built here, whose Python parts,
prefetch placement and serial maps are known by construction of the pipeline (not of
the reader), and the run header of real fits under MirroredStrategy."""

import numpy as np
import pytest

import keras_dp_tools as kdt
from keras_dp_tools.capture.input_pipeline import describe_dataset
from keras_dp_tools.records.reader import read_records
from keras_dp_tools.records.writer import worker_records_path
from tests.helpers.training import GLOBAL_BATCH, dense_model, regression_data


def _rows(count=64):
    return np.ones((count, 8), np.float32)


def _generator():
    yield from _rows()


@pytest.fixture
def python_double(tf):
    def double(x):
        return tf.py_function(lambda value: value * 2, [x], tf.int64)

    return double


def test_from_generator_prefetched_last(tf):
    spec = tf.TensorSpec((8,), tf.float32)
    dataset = tf.data.Dataset.from_generator(_generator, output_signature=spec)

    described = describe_dataset(dataset.batch(4).prefetch(2).repeat())

    assert described == {
        "input_python": ["Dataset.from_generator"],
        "input_prefetch": "last",  # a repeat behind the prefetch changes nothing
        "input_serial_maps": 0,
    }


def test_py_function_in_a_serial_map_without_prefetch(tf, python_double):
    dataset = tf.data.Dataset.range(8).map(python_double).batch(2)

    assert describe_dataset(dataset) == {
        "input_python": ["map(tf.py_function)"],
        "input_prefetch": "missing",
        "input_serial_maps": 1,
    }


def test_numpy_function_and_prefetch_before_cache(tf):
    def triple(x):
        return tf.numpy_function(lambda value: value * 3, [x], tf.int64)

    dataset = tf.data.Dataset.range(8).map(triple, num_parallel_calls=2)
    dataset = dataset.prefetch(1).cache().batch(2)

    assert describe_dataset(dataset) == {
        "input_python": ["map(tf.numpy_function)"],
        "input_prefetch": "before cache",
        "input_serial_maps": 0,  # a parallel map
    }


def test_pure_tf_data_near_miss(tf):
    # Graph ops only, a parallel map, the prefetch last behind options: nothing to name.
    dataset = tf.data.Dataset.from_tensor_slices(_rows()).map(
        lambda x: x * 2, num_parallel_calls=tf.data.AUTOTUNE
    )
    options = tf.data.Options()
    options.experimental_deterministic = True
    dataset = dataset.cache().batch(8).prefetch(tf.data.AUTOTUNE).with_options(options)

    assert describe_dataset(dataset) == {
        "input_python": [],
        "input_prefetch": "last",
        "input_serial_maps": 0,
    }


def test_prefetch_not_last(tf):
    dataset = tf.data.Dataset.range(8).prefetch(1).map(lambda x: x + 1).batch(2)

    described = describe_dataset(dataset)

    assert described["input_prefetch"] == "not last"
    assert described["input_serial_maps"] == 1


def test_zip_inputs_are_walked(tf, python_double):
    python = tf.data.Dataset.range(8).map(python_double)
    plain = tf.data.Dataset.range(8)

    described = describe_dataset(tf.data.Dataset.zip((plain, python)).batch(2))

    assert described["input_python"] == ["map(tf.py_function)"]


def _header(tmp_path) -> dict:
    records = read_records(worker_records_path(tmp_path, 0))
    return records[records["type"] == "header"].iloc[0].to_dict()


@pytest.mark.slow
def test_fit_headers_name_the_input(tmp_path, keras, tf, strategy4):
    class Rows(keras.utils.PyDataset):
        def __len__(self):
            return 3

        def __getitem__(self, index):
            x, y = regression_data()
            return x[:GLOBAL_BATCH], y[:GLOBAL_BATCH]

    model = dense_model(keras, strategy4)
    model.fit(Rows(workers=2), epochs=1, verbose=0, callbacks=kdt.callbacks(tmp_path / "py"))
    header = _header(tmp_path / "py")
    assert header["input_kind"] == "py_dataset"
    assert list(header["input_python"]) == ["Rows.__getitem__"]
    assert header["input_workers"] == 2 and header["input_multiprocessing"] is False

    x, y = regression_data()
    model.fit(x, y, batch_size=GLOBAL_BATCH, verbose=0, callbacks=kdt.callbacks(tmp_path / "a"))
    header = _header(tmp_path / "a")
    assert header["input_kind"] == "arrays"
    assert list(header["input_python"]) == []

    def pairs():
        yield from zip(x, y, strict=True)

    spec = (tf.TensorSpec((8,), tf.float32), tf.TensorSpec((1,), tf.float32))
    dataset = tf.data.Dataset.from_generator(pairs, output_signature=spec).batch(GLOBAL_BATCH)
    model.fit(dataset, epochs=1, verbose=0, callbacks=kdt.callbacks(tmp_path / "g"))
    header = _header(tmp_path / "g")
    assert header["input_kind"] == "tf.data"
    assert list(header["input_python"]) == ["Dataset.from_generator"]
    assert header["input_prefetch"] == "missing"
