"""Batch checks that do not misfire (issue 36): no data parallelism is an error with no
batch advice; a generator that yields batches is not "unbatched"; a batch written as a
product of numbers is never multiplied twice.

Each real fit is checked against what the model itself saw: ``SeenBatch`` keeps the
static batch dimension of its input at trace time, i.e. the examples each replica
trains on per step (the global batch when there is one replica).
"""

import warnings

import numpy as np
import pytest

import keras_dp_tools as kdt
from keras_dp_tools.checks.data_parallelism import ParallelismFacts, data_parallelism_findings
from keras_dp_tools.checks.literal_batch import dataset_batch_products, fit_batch_product

EXAMPLES = 128


def _seen_batch_model(keras_module, strategy=None):
    """A dense model whose first layer notes the per-replica batch it is traced with;
    built and compiled under ``strategy.scope()``, or outside any scope (None)."""

    class SeenBatch(keras_module.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.seen = []

        def call(self, inputs):
            self.seen.append(inputs.shape[0])
            return inputs

    def build():
        seen = SeenBatch()
        model = keras_module.Sequential(
            [keras_module.Input((8,)), seen, keras_module.layers.Dense(1)]
        )
        model.compile(optimizer="sgd", loss="mse")
        return model, seen

    if strategy is None:
        return build()
    with strategy.scope():
        return build()


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(EXAMPLES, 8)).astype("float32")
    return x, x.sum(axis=1, keepdims=True)


def _fit(model, data, check, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(data, epochs=1, verbose=0, callbacks=[check], **kwargs)
    return [w for w in caught if w.category is kdt.BatchScalingWarning]


def _trained_per_replica(seen) -> int:
    """The per-replica batch of the training step (the last trace: Keras 3 may trace a
    symbolic build first)."""
    sizes = {size for size in seen.seen if size is not None}
    assert len(sizes) == 1, seen.seen
    return sizes.pop()


# --- 1. No data parallelism: an error, and no batch advice then ---------------------


@pytest.mark.parametrize("package", ["keras", "tf_keras"])
def test_a_model_built_outside_the_scope_is_an_error_without_batch_advice(
    request, tf, tmp_path, package
):
    """4 CPU devices are visible; the model is built and compiled outside any scope.
    Told 32 per replica, the old check proposed fit(batch_size=32) for this batch of 64
    (halving it) instead of naming the cause."""
    keras_module = request.getfixturevalue(package)
    model, seen = _seen_batch_model(keras_module)
    x, y = _data()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(64, drop_remainder=True)
    check = kdt.BatchScalingCheck(dataset, per_replica_batch=32, log_dir=tmp_path)

    ours = _fit(model, dataset, check)

    assert _trained_per_replica(seen) == 64  # the fact: one replica took the whole batch
    assert len(tf.config.list_logical_devices("CPU")) == 4
    assert [f.code for f in check.findings] == ["no-data-parallelism"]
    (error,) = check.findings
    assert error.severity == "error"
    assert "1 replica while 4 CPU devices are visible" in error.message
    assert "default strategy" in error.message and "not mirrored" in error.message
    assert "strategy.scope()" in error.fix and "batch" not in error.fix
    assert len(ours) == 1 and "No data parallelism" in str(ours[0].message)
    report = kdt.Report.load(tmp_path)
    assert report.batching["code"].tolist() == ["no-data-parallelism"]
    assert any(
        item.code == "no-data-parallelism" and item.severity == "error" for item in report.advice()
    )


def test_without_data_parallelism_a_literal_product_gets_no_batch_fix(keras, tf):
    """.batch(32 * 2) outside any scope: the one finding is the missing scope; the
    product is not read as a replica count of a run that has none."""
    model, seen = _seen_batch_model(keras)
    x, y = _data()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(32 * 2, drop_remainder=True)
    check = kdt.BatchScalingCheck(dataset)

    _fit(model, dataset, check)

    assert _trained_per_replica(seen) == 64
    assert [f.code for f in check.findings] == ["no-data-parallelism"]


def test_a_strategy_over_one_of_several_devices_is_named_as_the_cause(keras, tf, strategy1):
    model, seen = _seen_batch_model(keras, strategy1)
    x, y = _data()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(64, drop_remainder=True)
    check = kdt.BatchScalingCheck(dataset, per_replica_batch=64)

    _fit(model, dataset, check)

    assert _trained_per_replica(seen) == 64 and strategy1.num_replicas_in_sync == 1
    assert [f.code for f in check.findings] == ["no-data-parallelism"]
    message, fix = check.findings[0].message, check.findings[0].fix
    assert "MirroredStrategy has one replica" in message and "not mirrored" not in message
    assert "no devices argument" in fix and "deliberate baseline" in fix


@pytest.mark.parametrize("package", ["keras", "tf_keras"])
def test_near_miss_the_same_model_under_the_scope_is_data_parallel(request, tf, strategy4, package):
    model, seen = _seen_batch_model(request.getfixturevalue(package), strategy4)
    x, y = _data()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(64, drop_remainder=True)
    check = kdt.BatchScalingCheck(dataset, per_replica_batch=16)

    ours = _fit(model, dataset, check)

    assert _trained_per_replica(seen) == 64 // strategy4.num_replicas_in_sync == 16
    assert check.findings == [] and ours == []


def test_kdt_callbacks_check_data_parallelism_without_being_told_the_batch(keras, tf, tmp_path):
    model, seen = _seen_batch_model(keras)
    x, y = _data()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(32, drop_remainder=True)
    callbacks = kdt.callbacks(tmp_path, profile=False, monitor=False, tensorboard=False)

    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        model.fit(dataset, epochs=1, verbose=0, callbacks=callbacks)

    assert _trained_per_replica(seen) == 32  # one replica took the whole batch
    assert kdt.Report.load(tmp_path).batching["code"].tolist() == ["no-data-parallelism"]


@pytest.mark.parametrize(
    ("facts", "fires"),
    [
        (ParallelismFacts("_DefaultDistributionStrategy", True, 1, False, 8, "GPU"), True),
        (ParallelismFacts("MirroredStrategy", False, 1, True, 2, "CPU"), True),
        (ParallelismFacts("_DefaultDistributionStrategy", True, 1, False, 1, "GPU"), False),
        (ParallelismFacts("MirroredStrategy", False, 1, True, 1, "CPU"), False),
        (ParallelismFacts("MirroredStrategy", False, 8, True, 8, "GPU"), False),
        (ParallelismFacts("MirroredStrategy", False, 2, True, 8, "GPU"), False),
    ],
    ids=["default-8-gpus", "one-of-2-cpus", "one-gpu", "one-cpu", "all-8", "2-of-8"],
)
def test_one_replica_is_an_error_only_while_more_devices_are_visible(facts, fires):
    findings = data_parallelism_findings(facts)
    assert [f.code for f in findings] == (["no-data-parallelism"] if fires else [])
    if fires:
        idle = facts.devices - 1
        assert f"{idle} of them stay idle" in findings[0].message


# --- 2. Literal products: never multiplied twice --------------------------------------


def test_a_literal_product_of_this_runs_replicas_is_already_global(keras, tf, strategy4):
    """.batch(16 * 4) on 4 replicas: 16 per replica, as the model's trace shows. The fix
    replaces the 4; it never scales 16 * 4 again."""
    model, seen = _seen_batch_model(keras, strategy4)
    x, y = _data()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(16 * 4, drop_remainder=True)
    check = kdt.BatchScalingCheck(dataset)

    ours = _fit(model, dataset, check)

    assert _trained_per_replica(seen) == 16
    assert [(f.code, f.severity) for f in check.findings] == [("hard-coded-replica-count", "info")]
    finding = check.findings[0]
    assert "dataset.batch(16 * 4)" in finding.message and __file__ in finding.message
    assert "global batch of 16 per replica" in finding.message
    assert finding.fix == (
        "If 4 is your replica count, write dataset.batch(16 * strategy.num_replicas_in_sync)."
    )
    assert ours == []  # info: no warning


def test_a_literal_product_for_other_devices_says_what_each_replica_gets(keras, tf, strategy4):
    """.batch(16 * 2) on 4 replicas: the code reads as 16 per replica, the model's trace
    shows 8."""
    model, seen = _seen_batch_model(keras, strategy4)
    x, y = _data()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(16 * 2, drop_remainder=True)
    check = kdt.BatchScalingCheck(dataset)

    ours = _fit(model, dataset, check)

    trained = _trained_per_replica(seen)
    assert trained == 8
    assert [(f.code, f.severity) for f in check.findings] == [
        ("hard-coded-replica-count", "warning")
    ]
    message, fix = check.findings[0].message, check.findings[0].fix
    assert f"each replica trains on {trained} examples per step" in message
    assert (
        fix
        == "If 2 is your replica count, write dataset.batch(16 * strategy.num_replicas_in_sync)."
    )
    assert len(ours) == 1


@pytest.mark.parametrize("package", ["keras", "tf_keras"])
def test_fit_batch_size_written_as_a_product_is_read_from_the_fit_line(request, strategy4, package):
    model, _ = _seen_batch_model(request.getfixturevalue(package), strategy4)
    x, y = _data()
    check = kdt.BatchScalingCheck()
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        model.fit(x, y, batch_size=8 * 4, epochs=1, verbose=0, callbacks=[check])

    assert [f.code for f in check.findings] == ["hard-coded-replica-count"]
    assert f"this run's {strategy4.num_replicas_in_sync} replicas" in check.findings[0].message
    assert "fit(batch_size=8 * 4)" in check.findings[0].message
    assert check.findings[0].fix.endswith("fit(batch_size=8 * strategy.num_replicas_in_sync).")
    assert "8 * 4 * strategy" not in str(check.findings[0])


def test_near_miss_a_batch_written_otherwise_is_not_read_as_a_product(keras, tf, strategy4):
    batch = 64
    model, _ = _seen_batch_model(keras, strategy4)
    x, y = _data()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)
    check = kdt.BatchScalingCheck(dataset)

    _fit(model, dataset, check)

    assert check.findings == []


def test_a_stated_per_replica_batch_equal_to_the_product_notes_it_may_be_global():
    """missing-multiply's fix would scale 16 * 4 again: it says the other reading too."""
    from keras_dp_tools.checks.batching import DatasetBatch
    from keras_dp_tools.checks.literal_batch import LiteralProduct

    written = LiteralProduct("16 * 4", (16, 4), 3, "train.py")
    batch = DatasetBatch(64, True, batched=True, remainder=0, written=written)

    (finding,) = kdt.check_batching(batch, 4, per_replica_batch=64, warn=False)

    assert finding.code == "missing-multiply"
    assert "write dataset.batch(16 * strategy.num_replicas_in_sync)" in finding.fix
    assert "per_replica_batch=16" in finding.fix


def test_literal_products_are_found_by_value_in_the_source():
    source = (
        "a = ds.batch(32 * 4)\n"
        "b = ds.padded_batch(batch_size=8 * 2 * 4, drop_remainder=True)\n"
        "c = ds.batch(BATCH * 4)\n"  # a name: not a literal product
        "d = ds.batch(128)\n"
        "model.fit(\n  x, y,\n  batch_size=16 * 2)\n"
    )
    assert [(p.text, p.line) for p in dataset_batch_products(source, 128)] == [("32 * 4", 1)]
    assert [p.factors for p in dataset_batch_products(source, 64)] == [(8, 2, 4)]
    assert dataset_batch_products(source, 256) == []
    assert fit_batch_product(source, 5, 32).text == "16 * 2"
    assert fit_batch_product(source, 1, 32) is None  # not the fit line
    assert dataset_batch_products("def broken(:\n", 128) == []
    (product,) = dataset_batch_products(source, 64)
    assert product.scaled_text(4) == "8 * 2 * strategy.num_replicas_in_sync"
    assert product.scaled_text(3) == "8 * 2 * strategy.num_replicas_in_sync"  # last factor


# --- 3. A source that already yields batches ------------------------------------------


def _batches(x, y, size):
    def generate():
        for start in range(0, len(x), size):
            yield x[start : start + size], y[start : start + size]

    return generate


@pytest.mark.parametrize("leading", [16, None], ids=["static-16", "unknown"])
def test_a_generator_of_batches_is_checked_by_their_size(keras, tf, strategy4, leading):
    """The generator yields (16, 8) arrays, the model's input rank: batches, not single
    examples. Told 16 per replica, a static 16 is the missing multiply (the model's
    trace shows 4 per replica); an unknown size is said, not guessed."""
    model, seen = _seen_batch_model(keras, strategy4)
    x, y = _data()
    dataset = tf.data.Dataset.from_generator(
        _batches(x, y, 16),
        output_signature=(tf.TensorSpec([leading, 8]), tf.TensorSpec([leading, 1])),
    )
    check = kdt.BatchScalingCheck(dataset, per_replica_batch=16)

    _fit(model, dataset, check)

    if leading:
        assert _trained_per_replica(seen) == 4
        assert [f.code for f in check.findings] == ["missing-multiply"]
        assert "yields batches of 16" in check.findings[0].message
        assert "each replica trains on 4 examples" in check.findings[0].message
    else:
        assert [f.code for f in check.findings] == ["unknown-batch"]
        assert "yields whole batches" in check.findings[0].message


def test_near_miss_a_generator_of_single_examples_is_unbatched(keras, tf, strategy4):
    x, y = _data()

    def examples():
        yield from zip(x, y, strict=True)

    dataset = tf.data.Dataset.from_generator(
        examples, output_signature=(tf.TensorSpec([8]), tf.TensorSpec([1]))
    )
    model, _ = _seen_batch_model(keras, strategy4)
    assert len(model.inputs[0].shape) == 2  # the fact: elements are one rank lower

    findings = kdt.check_batching(dataset, strategy4, warn=False, model=model)
    no_model = kdt.check_batching(dataset, strategy4, warn=False)

    assert [f.code for f in findings] == ["unbatched"]
    assert [f.code for f in no_model] == ["unknown-batch"]  # without the model: said


def _indexed_batches(base, size):
    """A ``Sequence``/``PyDataset`` (``base``) of batches of ``size`` over ``_data()``."""
    x, y = _data()

    class Batches(base):
        def __len__(self):
            return len(x) // size

        def __getitem__(self, index):
            rows = slice(index * size, (index + 1) * size)
            return x[rows], y[rows]

    return Batches()


def test_a_keras_pydataset_of_batches_is_read_not_a_measurement_failure(keras, strategy4):
    model, seen = _seen_batch_model(keras, strategy4)
    check = kdt.BatchScalingCheck(per_replica_batch=4)

    ours = _fit(model, _indexed_batches(keras.utils.PyDataset, 16), check)

    assert not check.failed
    assert _trained_per_replica(seen) == 4
    assert check.findings == [] and ours == []  # 16 = 4 per replica x 4


def test_a_tf_keras_sequence_of_batches_is_checked_by_its_first_batch(tf_keras, strategy4):
    model, _ = _seen_batch_model(tf_keras, strategy4)
    check = kdt.BatchScalingCheck(per_replica_batch=16)

    _fit(model, _indexed_batches(tf_keras.utils.Sequence, 16), check)

    assert not check.failed
    assert [f.code for f in check.findings] == ["missing-multiply"]
    assert "yield batches of 16 * strategy.num_replicas_in_sync" in check.findings[0].fix
