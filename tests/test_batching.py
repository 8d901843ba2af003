"""check_batching on real tf.data datasets, and BatchScalingCheck in a real fit."""

import dataclasses
import time
import warnings

import pytest

import keras_dp_tools as kdt
from keras_dp_tools.checks.batching import _graph_batch, dataset_batch, walk_batch
from tests.helpers.training import dense_model, regression_data


@pytest.fixture(scope="module")
def data(tf):
    return tf.data.Dataset.range(1000)


def codes(dataset, replicas=4, per_replica=64):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kdt.BatchScalingWarning)
        return [
            f.code for f in kdt.check_batching(dataset, replicas, per_replica_batch=per_replica)
        ]


def test_the_missing_multiply_is_an_error_with_the_exact_fix(data):
    with pytest.warns(
        kdt.BatchScalingWarning, match="each replica trains on 16 examples"
    ) as caught:
        findings = kdt.check_batching(data.batch(64, drop_remainder=True), 4, per_replica_batch=64)

    assert [f.code for f in findings] == ["missing-multiply"]
    assert findings[0].severity == "error"
    assert (
        "dataset.batch(64 * strategy.num_replicas_in_sync) = dataset.batch(256)" in findings[0].fix
    )
    assert len(caught) == 1


def test_a_correct_global_batch_passes(data, strategy4):
    assert kdt.check_batching(data.batch(256, drop_remainder=True), strategy4, 64) == []


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (
            lambda d: d.map(lambda x: (x, x)).shuffle(10).batch(64).prefetch(2),
            ["missing-multiply", "partial-last-batch"],
        ),
        (lambda d: d.batch(6, drop_remainder=True), ["batch-mismatch", "uneven-split"]),
        (lambda d: d.batch(2, drop_remainder=True), ["batch-mismatch", "empty-replicas"]),
        (lambda d: d, ["unbatched"]),
        (lambda d: d.batch(64).unbatch(), ["unbatched"]),
        (lambda d: d.padded_batch(256, drop_remainder=True), []),
    ],
    ids=[
        "map-shuffle-batch-prefetch",
        "uneven",
        "fewer-than-replicas",
        "unbatched",
        "unbatch",
        "padded",
    ],
)
def test_findings_for_common_pipelines(data, make, expected):
    assert codes(make(data)) == expected


def test_unknown_batch_is_said_not_guessed(tf):
    dataset = tf.data.Dataset.from_generator(
        lambda: iter([[1, 2]]), output_signature=tf.TensorSpec([None], tf.int64)
    )
    assert codes(dataset) == ["unknown-batch"]


def test_without_per_replica_batch_only_the_split_is_checked(data):
    assert codes(data.batch(64, drop_remainder=True), per_replica=None) == []
    assert codes(data.batch(66, drop_remainder=True), per_replica=None) == ["uneven-split"]


def test_reads_the_batch_without_consuming_data(tf):
    pulled = []

    def generate():
        for value in range(100):
            pulled.append(value)
            yield [value]

    dataset = tf.data.Dataset.from_generator(
        generate, output_signature=tf.TensorSpec([1], tf.int64)
    ).batch(64)
    assert dataset_batch(dataset).size == 64
    codes(dataset)
    assert pulled == []


def test_distributed_dataset_is_recognised(data, strategy4):
    distributed = strategy4.experimental_distribute_dataset(data.batch(256))
    assert codes(distributed) == ["already-distributed"]


def test_check_runs_before_the_first_step_and_is_recorded(tmp_path, keras, strategy4, tf):
    events = []

    class Steps(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            events.append("step")

    x, y = regression_data()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)  # meant 8 per replica
    plan = kdt.plan_scaling(2, 8, base_lr=0.01, base_batch=8)  # made for 2 replicas
    check = kdt.BatchScalingCheck(dataset, per_replica_batch=8, log_dir=tmp_path, plan=plan)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dense_model(keras, strategy4).fit(dataset, epochs=1, verbose=0, callbacks=[check, Steps()])
    ours = [str(w.message) for w in caught if w.category is kdt.BatchScalingWarning]
    assert len(ours) == 2 and "each replica trains on 2 examples" in ours[0]
    assert "plan is for 2 replicas, the strategy has 4" in ours[1]
    # 224 examples in batches of 8: no partial last batch to note.
    assert [f.code for f in check.findings] == ["missing-multiply", "plan-mismatch"]

    report = kdt.Report.load(tmp_path)
    assert report.batching["code"].tolist() == ["missing-multiply", "plan-mismatch"]
    assert events  # training went on


def test_plan_reaches_tensorboard_text(tmp_path, keras, strategy4):
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    plan = kdt.plan_scaling(strategy4, 8, base_lr=0.01, base_batch=32)
    x, y = regression_data()
    model = dense_model(keras, strategy4)
    model.fit(
        x,
        y,
        batch_size=32,
        verbose=0,
        callbacks=kdt.callbacks(tmp_path, plan=plan, profile=False, monitor=False),
    )

    multiplexer = EventMultiplexer(size_guidance={"tensors": 0})
    multiplexer.AddRunsFromDirectory(str(tmp_path))
    multiplexer.Reload()
    texts = multiplexer.GetAccumulator("keras_dp/worker-0").Tensors("keras_dp/scaling_plan")
    assert b"global batch of 32" in texts[0].tensor_proto.string_val[0]


@pytest.mark.parametrize(
    ("examples", "make", "remainder"),
    [
        (1280, lambda d: d.batch(32), 0),  # 40 full batches: nothing to say
        (1000, lambda d: d.shuffle(10).batch(32).prefetch(1), 1000 % 32),
        (1000, lambda d: d.repeat().batch(32), 0),  # endless: no last batch
        (1000, lambda d: d.batch(32, drop_remainder=True), 0),
    ],
    ids=["even", "uneven", "repeated", "dropped"],
)
def test_partial_last_batch_only_when_the_examples_do_not_divide(tf, examples, make, remainder):
    dataset = make(tf.data.Dataset.range(examples))

    batch = dataset_batch(dataset)
    findings = kdt.check_batching(dataset, 4, warn=False)

    assert batch.remainder == remainder
    partial = [f for f in findings if f.code == "partial-last-batch"]
    assert len(partial) == (1 if remainder else 0)
    if remainder:
        assert f"has {remainder} examples" in partial[0].message


def test_a_generator_of_unknown_length_may_keep_a_partial_batch(tf):
    dataset = tf.data.Dataset.from_generator(
        lambda: iter([[1]]), output_signature=tf.TensorSpec([1], tf.int64)
    ).batch(64)
    assert dataset_batch(dataset).remainder is None
    assert codes(dataset, per_replica=16) == ["partial-last-batch"]


PIPELINES = {
    "plain": lambda d: d.batch(64),
    "dropped": lambda d: d.batch(64, drop_remainder=True),
    "shuffle-prefetch": lambda d: d.shuffle(10).batch(32).prefetch(1),
    "repeat-then-batch": lambda d: d.repeat().batch(32),
    "batch-then-repeat": lambda d: d.batch(32).repeat(),
    "padded": lambda d: d.padded_batch(256, drop_remainder=True),
    "parallel": lambda d: d.map(lambda x: x, num_parallel_calls=2).batch(3, num_parallel_calls=2),
    "batches-shuffled": lambda d: d.batch(7).shuffle(3),
    "filtered": lambda d: d.filter(lambda x: x > 3).batch(8),
    "taken": lambda d: d.batch(8).take(3),
    "unbatch": lambda d: d.batch(64).unbatch(),
    "unbatched": lambda d: d,
}


@pytest.mark.parametrize("make", PIPELINES.values(), ids=PIPELINES.keys())
def test_the_python_walk_reads_what_the_graph_says(data, make):
    """Two readers of one dataset: its Python objects and its serialized graph."""
    dataset = make(data)

    walked, _ = walk_batch(dataset)

    assert walked is not None
    assert dataclasses.replace(walked, pass_batches=None) == _graph_batch(dataset)


def test_a_pass_places_its_smaller_last_batch_only_when_nothing_reorders_batches(data):
    assert walk_batch(data.batch(64).prefetch(1))[0].pass_batches == 16  # 15 x 64 + 40
    assert walk_batch(data.batch(32).repeat())[0].pass_batches == 32  # 31 x 32 + 8
    assert walk_batch(data.batch(7).shuffle(3))[0].pass_batches is None
    assert walk_batch(data.batch(64, drop_remainder=True))[0].pass_batches is None


def _slow_full_batches(tf, batch):
    """A map that takes 20 ms over a full batch of 64 and no time over a smaller one, so
    a parallel map free to reorder hands the smaller batch on early."""

    def wait(values):
        time.sleep(0.02 if len(values) == 64 else 0)
        return values

    return tf.numpy_function(wait, [batch], tf.int64)


def _arrival_of_the_smaller_batch(dataset) -> int:
    return [len(batch) for batch in dataset].index(40)


def test_a_parallel_map_free_to_reorder_does_not_place_the_smaller_batch(tf, data):
    """1,000 by 64: the batch of 40 is the 16th (index 15) only while order is kept."""
    free = data.batch(64).map(
        lambda b: _slow_full_batches(tf, b), num_parallel_calls=8, deterministic=False
    )
    options = tf.data.Options()
    options.deterministic = False
    by_options = data.batch(64).map(lambda b: _slow_full_batches(tf, b), num_parallel_calls=8)
    by_options = by_options.with_options(options)
    kept = data.batch(64).map(
        lambda b: _slow_full_batches(tf, b), num_parallel_calls=8, deterministic=True
    )

    assert _arrival_of_the_smaller_batch(free) < 15  # the fact the walk must respect
    assert walk_batch(free)[0].pass_batches is None
    assert walk_batch(by_options)[0].pass_batches is None
    assert walk_batch(kept.with_options(options))[0].pass_batches == 16  # said "true"
    assert _arrival_of_the_smaller_batch(kept.with_options(options)) == 15
    free_batching = data.batch(64, num_parallel_calls=4, deterministic=False)
    assert walk_batch(free_batching)[0].pass_batches is None
    assert walk_batch(data.batch(64, num_parallel_calls=4))[0].pass_batches == 16


def test_a_batch_size_that_is_not_a_constant_is_said_in_a_sentence(tf, data):
    """A dataset built inside a tf.function: its batch size is a symbolic tensor."""
    said = []

    @tf.function
    def build(size):
        said.append(walk_batch(data.batch(size)))
        return size

    build(tf.constant(64, tf.int64))

    ((batch, reason),) = said
    assert batch is None
    assert reason == (
        "its _BatchDataset's batch size or drop_remainder is not a constant (a dataset "
        "built inside a tf.function?)"
    )


def test_a_large_in_memory_dataset_is_checked_without_serializing_it(tf):
    """from_tensor_slices over 200 MB: the graph embeds the array (seconds to serialize);
    the check reads the batch op instead, and still finds the missing multiply."""
    import numpy as np

    images = np.zeros((200_000, 250), "float32")  # 200 MB
    labels = np.zeros(200_000, "int32")
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).shuffle(10).batch(64)

    started = time.perf_counter()
    with pytest.warns(kdt.BatchScalingWarning, match="num_replicas_in_sync"):
        findings = kdt.check_batching(dataset.prefetch(2), 4, per_replica_batch=64)
    check_s = time.perf_counter() - started
    started = time.perf_counter()
    from_graph = _graph_batch(dataset)
    graph_s = time.perf_counter() - started

    assert [f.code for f in findings] == ["missing-multiply"]
    assert from_graph.size == 64  # the old reader agrees on the batch...
    assert check_s < 1.0 and check_s < graph_s / 10  # ...at a fraction of its time


def test_arrays_are_refused_with_a_pointer_to_the_callback():
    import numpy as np

    with pytest.raises(TypeError, match=r"received a numpy.ndarray.*BatchScalingCheck"):
        kdt.check_batching(np.zeros((64, 8)), 4)


def _fit_arrays(keras_module, strategy, check, batch_size, examples=224):
    x, y = regression_data(examples)
    model = dense_model(keras_module, strategy)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x, y, batch_size=batch_size, epochs=1, verbose=0, callbacks=[check])
    return caught


@pytest.mark.parametrize("package", ["keras", "tf_keras"])
@pytest.mark.parametrize("given", ["nothing", "the arrays"])
def test_fit_on_arrays_is_checked_by_its_batch_size(request, strategy4, package, given):
    """fit(x, y, batch_size=8) under 4 replicas: the batch_size, not x, is the batch."""
    x, _ = regression_data()
    check = kdt.BatchScalingCheck(x if given == "the arrays" else None, per_replica_batch=8)

    caught = _fit_arrays(request.getfixturevalue(package), strategy4, check, batch_size=8)

    assert not check.failed
    assert [f.code for f in check.findings] == ["missing-multiply"]  # 224 = 28 x 8: no remainder
    assert "fit(batch_size=8 * strategy.num_replicas_in_sync) = fit(batch_size=32)" in (
        check.findings[0].fix
    )
    ours = [w for w in caught if w.category in (kdt.BatchScalingWarning, kdt.MeasurementWarning)]
    assert [w.category for w in ours] == [kdt.BatchScalingWarning]
    assert ours[0].filename == __file__  # the user's fit line, not ours or Keras's


def test_fit_on_arrays_reports_the_last_batch_it_makes(keras, strategy4):
    check = kdt.BatchScalingCheck(per_replica_batch=12)

    _fit_arrays(keras, strategy4, check, batch_size=48)  # 224 = 4 x 48 + 32

    assert [f.code for f in check.findings] == ["partial-last-batch"]
    assert "has 32 examples" in check.findings[0].message


def test_without_fit_data_the_batch_is_unknown_not_guessed(keras, strategy4):
    check = kdt.BatchScalingCheck(per_replica_batch=8)
    check.set_model(dense_model(keras, strategy4))

    with pytest.warns(kdt.BatchScalingWarning, match="batch size cannot be read") as caught:
        check.on_train_begin()  # outside fit: no data adapter to read

    assert [f.code for f in check.findings] == ["unknown-batch"] and not check.failed
    assert caught[0].filename == __file__


@pytest.mark.parametrize("package", ["keras", "tf_keras"])
def test_a_per_replica_batch_from_distribute_datasets_from_function_is_not_warned(
    request, tf, strategy4, package
):
    """The dataset_fn's batch is per replica by contract: 8 per replica is right."""
    x, y = regression_data(256)

    def dataset_fn(input_context):
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(8, drop_remainder=True)

    dataset = strategy4.distribute_datasets_from_function(dataset_fn)
    model = dense_model(request.getfixturevalue(package), strategy4)
    check = kdt.BatchScalingCheck(per_replica_batch=8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(dataset, epochs=1, steps_per_epoch=2, verbose=0, callbacks=[check])

    assert [f.code for f in check.findings] == ["already-distributed"]
    assert not [w for w in caught if w.category is kdt.BatchScalingWarning]
