"""StepTimer on real MirroredStrategy training (4 logical CPU devices), Keras 3 and tf_keras."""

import numpy as np
import pytest

import keras_dp_tools as kdt
from keras_dp_tools.records.writer import worker_records_path
from tests.helpers.training import GLOBAL_BATCH, dense_model, fit, iterations, regression_data


def test_one_record_per_step_with_positive_times(tmp_path, keras, strategy4):
    fit(dense_model(keras, strategy4), kdt.callbacks(tmp_path, global_batch=GLOBAL_BATCH), 2)
    report = kdt.Report.load(tmp_path)

    steps = report.steps
    assert steps["step"].tolist() == list(range(14))
    assert steps["epoch"].tolist() == [0] * 7 + [1] * 7
    assert (steps["steps"] == 1).all()
    assert (steps["step_ms"] > 0).all()
    assert steps["warmup"].tolist() == [True] + [False] * 13
    assert np.allclose(steps["examples_per_s"], GLOBAL_BATCH / steps["step_ms"] * 1000)
    run = report.runs.iloc[0]
    assert run["strategy"] == "MirroredStrategy"
    assert run["replicas"] == 4 and run["workers"] == 1 and run["global_batch"] == GLOBAL_BATCH
    assert len(run["devices"]) == 4
    assert run["keras_package"] == "keras"


def test_steps_per_execution_gives_one_record_per_call_divided(tmp_path, keras, tf):
    # Keras 3.15 itself fails fit under MirroredStrategy with steps_per_execution > 1
    # (keras-team/keras#19246), so Keras 3 is checked on the default strategy and
    # tf_keras under MirroredStrategy below.
    model = dense_model(keras, tf.distribute.get_strategy(), steps_per_execution=3)

    fit(model, kdt.callbacks(tmp_path), epochs=2)  # 7 steps per epoch: calls of 3, 3 and 1
    report = kdt.Report.load(tmp_path)

    assert report.steps["steps"].tolist() == [3, 3, 1, 3, 3, 1]
    assert report.steps["step"].tolist() == [0, 3, 6, 7, 10, 13]
    assert iterations(model) == 14
    # global_batch was not given: fit's batch_size (32) is, whatever a call covers.
    assert np.allclose(
        report.steps["examples_per_s"], GLOBAL_BATCH / report.steps["step_ms"] * 1000
    )
    assert report.runs.iloc[0]["steps_per_execution"] == 3


def test_tf_keras_model_is_recorded(tmp_path, tf_keras, strategy4):
    fit(dense_model(tf_keras, strategy4), kdt.callbacks(tmp_path, global_batch=GLOBAL_BATCH))
    report = kdt.Report.load(tmp_path)

    assert report.steps["step"].tolist() == list(range(7))
    assert (report.steps["step_ms"] > 0).all()
    assert report.runs.iloc[0]["keras_package"] == "tf_keras"


def test_tf_keras_steps_per_execution(tmp_path, tf_keras, strategy4):
    fit(dense_model(tf_keras, strategy4, steps_per_execution=3), kdt.callbacks(tmp_path))

    assert kdt.Report.load(tmp_path).steps["steps"].tolist() == [3, 3, 1]


def test_second_fit_continues_the_run_and_the_global_step(tmp_path, keras, strategy4):
    model = dense_model(keras, strategy4)
    timer = kdt.StepTimer(tmp_path, global_batch=GLOBAL_BATCH)

    fit(model, [timer])
    fit(model, [timer])
    report = kdt.Report.load(tmp_path)

    assert report.steps["step"].tolist() == list(range(14))
    assert report.runs["run"].nunique() == 1
    assert report.steps["warmup"].sum() == 2  # each fit's first call


def test_a_new_strategy_in_the_same_log_dir_starts_a_new_run(tmp_path, keras, strategy1, strategy4):
    for strategy in (strategy1, strategy4):
        fit(dense_model(keras, strategy), kdt.callbacks(tmp_path))

    report = kdt.Report.load(tmp_path)

    assert report.runs["replicas"].tolist() == [1, 4]
    assert report.summary()["replicas"].tolist() == [1, 4]


def test_works_next_to_keras_tensorboard_on_the_same_log_dir(tmp_path, keras, strategy4):
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    callbacks = [
        keras.callbacks.TensorBoard(str(tmp_path)),
        *kdt.callbacks(tmp_path, global_batch=GLOBAL_BATCH),
    ]
    fit(dense_model(keras, strategy4), callbacks, epochs=2)
    multiplexer = EventMultiplexer(size_guidance={"tensors": 0})  # 0: keep every point
    multiplexer.AddRunsFromDirectory(str(tmp_path))
    multiplexer.Reload()

    assert {"train", "keras_dp/worker-0"} <= set(multiplexer.Runs())
    ours = multiplexer.GetAccumulator("keras_dp/worker-0")
    assert {"dp/step_ms", "dp/examples_per_s"} <= set(ours.Tags()["tensors"])
    steady = [event.step for event in ours.Tensors("dp/step_ms")]
    disturbed = [event.step for event in ours.Tensors("dp/step_ms_disturbed")]
    assert sorted(steady + disturbed) == list(range(14))
    # The headline tag leaves out the steps the summary leaves out: warm-up (step 0)
    # and the profiler window from step 10 (kdt.callbacks' default start).
    report = kdt.Report.load(tmp_path)
    excluded = report.steps[report.steps["warmup"] | report.steps["profiled"]]
    assert disturbed[0] == 0 and {10, 11, 12, 13} <= set(disturbed)
    assert set(disturbed) == set(excluded["step"])
    assert len(kdt.Report.load(tmp_path).steps) == 14


def test_a_failing_measurement_warns_once_and_training_goes_on(tmp_path, keras, strategy4):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the log dir should be")
    model = dense_model(keras, strategy4)

    with pytest.warns(kdt.MeasurementWarning, match="StepTimer stopped measuring") as caught:
        history = fit(model, kdt.callbacks(blocker), epochs=2)

    stopped = [str(w.message).split()[0] for w in caught if w.category is kdt.MeasurementWarning]
    assert sorted(stopped) == ["DataParallelProfiler", "GpuMonitor", "RunAdvisor", "StepTimer"]
    assert len(history.history["loss"]) == 2
    assert iterations(model) == 14


def test_records_survive_a_training_crash(tmp_path, keras, strategy4):
    class Crash(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 4:
                raise RuntimeError("user code failed")

    with pytest.raises(RuntimeError, match="user code failed"):
        fit(dense_model(keras, strategy4), [*kdt.callbacks(tmp_path), Crash()])

    assert kdt.Report.load(tmp_path).steps["step"].tolist() == [0, 1, 2, 3, 4]
    assert worker_records_path(tmp_path, 0).read_bytes().endswith(b"\n")


def test_invalid_global_batch_is_rejected_with_the_value(tmp_path):
    with pytest.raises(ValueError, match="received 0"):
        kdt.StepTimer(tmp_path, global_batch=0)


def test_callbacks_of_one_fit_share_a_run_in_any_order(tmp_path, keras, strategy4):
    profiler = kdt.DataParallelProfiler(tmp_path, start_step=2, window=2)
    fit(dense_model(keras, strategy4), [profiler, kdt.StepTimer(tmp_path, global_batch=32)])

    report = kdt.Report.load(tmp_path)
    assert report.runs["run"].nunique() == 1
    assert report.runs.iloc[0]["global_batch"] == 32  # the later callback filled it in
    assert set(report.windows["run"]) == set(report.steps["run"])


def _batch_sizes(dataset, batches):
    """The examples of the first ``batches`` batches the data yields: read off the data."""
    return [len(features) for features, _ in dataset.take(batches)]


def _check_examples_per_step(report, sizes_by_step):
    """Each call's examples and examples_per_s against the batches it trained on, and
    the summary's throughput against the same, over the timed (non-warm-up) calls."""
    steps = report.steps
    calls = zip(steps["step"], steps["steps"], strict=True)
    trained = [sum(sizes_by_step[first : first + n]) for first, n in calls]
    assert steps["examples"].tolist() == trained
    call_s = steps["step_ms"] * steps["steps"] / 1000
    assert np.allclose(steps["examples_per_s"], np.array(trained) / call_s)
    timed = ~steps["warmup"].astype(bool)
    expected = (np.array(trained) / call_s)[timed.to_numpy()]
    assert report.summary()["examples_per_s"].iloc[0] == pytest.approx(np.median(expected))


def test_a_partial_last_batch_counts_the_examples_it_holds(tmp_path, tf, keras, strategy4):
    """200 examples by 64: every epoch (one pass) ends with a batch of 8."""
    x, y = regression_data(200)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(64).prefetch(1)

    dense_model(keras, strategy4).fit(
        dataset, epochs=3, verbose=0, callbacks=[kdt.StepTimer(tmp_path)]
    )
    report = kdt.Report.load(tmp_path)

    assert _batch_sizes(dataset, 4) == [64, 64, 64, 8]
    _check_examples_per_step(report, _batch_sizes(dataset.repeat(), 12))
    assert report.steps["examples"].tolist()[3::4] == [8, 8, 8]


def test_a_repeated_pass_places_its_partial_batch_across_epochs(tmp_path, tf, keras, strategy4):
    """batch(64).repeat() with steps_per_epoch=3: the batch of 8 is every 4th step of
    the fit, whichever epoch it falls in."""
    x, y = regression_data(200)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(64).repeat()

    dense_model(keras, strategy4).fit(
        dataset, epochs=3, steps_per_epoch=3, verbose=0, callbacks=[kdt.StepTimer(tmp_path)]
    )
    report = kdt.Report.load(tmp_path)

    assert report.steps["step"].tolist() == list(range(9))
    _check_examples_per_step(report, _batch_sizes(dataset, 9))


def test_calls_of_several_steps_count_the_partial_batch_they_ran(tmp_path, tf_keras, strategy4):
    """Arrays batched by fit (200 by 64: 64, 64, 64, 8), 3 steps per call: the second
    call of each epoch is the batch of 8 alone."""
    x, y = regression_data(200)
    model = dense_model(tf_keras, strategy4, steps_per_execution=3)

    model.fit(x, y, batch_size=64, epochs=2, verbose=0, callbacks=[kdt.StepTimer(tmp_path)])
    report = kdt.Report.load(tmp_path)

    assert report.steps["steps"].tolist() == [3, 1, 3, 1]
    _check_examples_per_step(report, [64, 64, 64, 8] * 2)


def test_a_partial_batch_that_cannot_be_placed_is_said_not_guessed(tmp_path, tf, keras, strategy4):
    """Shuffled batches: the batch of 8 can be any step of an epoch."""
    x, y = regression_data(200)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(64).shuffle(4)

    dense_model(keras, strategy4).fit(
        dataset, epochs=1, verbose=0, callbacks=[kdt.StepTimer(tmp_path)]
    )
    steps = kdt.Report.load(tmp_path).steps

    assert steps["examples"].isna().all()
    assert np.allclose(steps["examples_per_s"], 64 / steps["step_ms"] * 1000)  # all as full


@pytest.mark.parametrize(("shuffle", "placed"), [(True, 4), ("batch", None)])
def test_tf_keras_shuffling_whole_batches_leaves_the_smaller_batch_unplaced(
    tmp_path, tf_keras, strategy4, shuffle, placed
):
    """200 by 64 (64, 64, 64, 8): tf_keras's shuffle=True shuffles examples and keeps the
    batch of 8 last; shuffle="batch" shuffles whole batches, so it can be any step
    (the review saw it trained as 64, 64, 8, 64, then 64, 8, 64, 64)."""
    from keras_dp_tools.capture.run_info import fit_last_batch

    x, y = regression_data(200)
    read = []
    reader = tf_keras.callbacks.LambdaCallback(
        on_train_begin=lambda logs: read.append(fit_last_batch())
    )

    dense_model(tf_keras, strategy4).fit(
        x,
        y,
        batch_size=64,
        epochs=2,
        shuffle=shuffle,
        verbose=0,
        callbacks=[reader, kdt.StepTimer(tmp_path)],
    )
    steps = kdt.Report.load(tmp_path).steps

    assert read == [(64, placed, 8)]  # the batch the reading is about, too
    if placed:
        _check_examples_per_step(kdt.Report.load(tmp_path), [64, 64, 64, 8] * 2)
    else:
        assert steps["examples"].isna().all()
        assert np.allclose(steps["examples_per_s"], 64 / steps["step_ms"] * 1000)


def test_steps_a_loss_scale_optimizer_skips_still_count_as_steps(tmp_path, keras):
    """Keras 3's LossScaleOptimizer does not advance ``iterations`` on a step it skips
    (non-finite gradients): an inf label in the first example makes it skip each
    epoch's first step. The steps the calls ran still follow the data: 200 by 64 is
    4 batches (64, 64, 64, 8), 3 steps per call."""
    x, y = regression_data(200)
    y[0] = np.inf
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    # No strategy: Keras 3.15's LossScaleOptimizer under MirroredStrategy with
    # steps_per_execution > 1 fails to build its train function.
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01))
    model.compile(optimizer=optimizer, loss="mse", steps_per_execution=3)

    model.fit(
        x,
        y,
        batch_size=64,
        epochs=2,
        shuffle=False,
        verbose=0,
        callbacks=[kdt.StepTimer(tmp_path)],
    )
    report = kdt.Report.load(tmp_path)

    assert iterations(model) == 6  # the fact: 2 of the 8 steps were skipped
    assert report.steps["step"].tolist() == [0, 3, 4, 7]
    assert report.steps["steps"].tolist() == [3, 1, 3, 1]
    _check_examples_per_step(report, [64, 64, 64, 8] * 2)
