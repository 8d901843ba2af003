"""check_batching on real tf.data datasets, and BatchScalingCheck in a real fit."""

import warnings

import pytest

import keras_dp_tools as kdt
from keras_dp_tools.batching import dataset_batch
from tests.training import dense_model, regression_data


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
    assert [f.code for f in check.findings] == [
        "missing-multiply",
        "partial-last-batch",
        "plan-mismatch",
    ]

    report = kdt.Report.load(tmp_path)
    assert report.batching["code"].tolist() == [
        "missing-multiply",
        "partial-last-batch",
        "plan-mismatch",
    ]
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
