"""DataParallelProfiler on real MirroredStrategy training over 4 logical CPU devices."""

import threading

import numpy as np
import pytest

import keras_dp_tools as kdt
from keras_dp_tools.analysis import find_traces
from keras_dp_tools.analysis.breakdown.xprof_steps import xprof_step_table
from tests.helpers.training import GLOBAL_BATCH, dense_model, fit, iterations


def profiled(log_dir, **kwargs):
    return kdt.DataParallelProfiler(log_dir, **{"start_step": 2, "window": 4, **kwargs})


def test_one_replica_has_no_allreduce(tmp_path, keras, strategy1):
    fit(dense_model(keras, strategy1), [profiled(tmp_path)])
    report = kdt.Report.load(tmp_path)

    assert report.windows["status"].tolist() == ["analysed"]
    assert report.replicas["step"].tolist() == [2, 3, 4, 5]
    assert (report.replicas["replica"] == 0).all()
    assert (report.replicas["allreduce_ms"] == 0).all()
    assert (report.replicas["compute_ms"] > 0).all()


@pytest.fixture(scope="module")
def four_replica_run(tmp_path_factory, keras, strategy4):
    """StepTimer + profiler over 14 steps: windows at steps 2-5 and 9-12."""
    log_dir = tmp_path_factory.mktemp("profiled")
    callbacks = [
        kdt.StepTimer(log_dir, global_batch=GLOBAL_BATCH),
        profiled(log_dir, every=7),
    ]
    fit(dense_model(keras, strategy4), callbacks, epochs=2)
    return log_dir, kdt.Report.load(log_dir)


def test_windows_are_recorded_with_profile_tab_runs(four_replica_run):
    log_dir, report = four_replica_run
    windows = report.windows
    assert windows["status"].tolist() == ["analysed", "analysed"]
    assert windows["start_step"].tolist() == [2, 9]
    assert windows["end_step"].tolist() == [6, 13]
    assert windows["steps_analysed"].tolist() == [4, 4]
    for window in windows.itertuples():
        trace = log_dir / window.trace
        assert trace.is_file() and trace.parent.name == window.profile_run
        assert trace.is_relative_to(log_dir / "train" / "plugins" / "profile")


def test_every_replica_of_every_profiled_step_is_broken_down(four_replica_run):
    _, report = four_replica_run
    replicas = report.replicas
    assert len(replicas) == 8 * 4
    assert sorted(replicas["replica"].unique()) == [0, 1, 2, 3]
    assert replicas["device"].str.endswith(("CPU:0", "CPU:1", "CPU:2", "CPU:3")).all()
    assert (replicas["allreduce_ms"] > 0).all()  # every replica all-reduces every step
    assert (replicas["allreduce_bytes"] == (8 * 16 + 16 + 16 + 1) * 4).all()
    parts = replicas[["compute_ms", "exposed_allreduce_ms", "input_ms", "other_ms"]].sum(axis=1)
    assert np.allclose(parts, replicas["step_ms"], rtol=0.05)
    assert np.allclose(replicas["sync_wait_ms"] + replicas["transfer_ms"], replicas["allreduce_ms"])


def test_profiled_steps_carry_the_breakdown_in_report_steps(four_replica_run):
    _, report = four_replica_run
    profiled_steps = report.steps.dropna(subset=["compute_ms"])
    assert profiled_steps["step"].tolist() == [2, 3, 4, 5, 9, 10, 11, 12]
    # The trace's step and the host wall time measure the same call.
    assert np.allclose(profiled_steps["trace_step_ms"], profiled_steps["step_ms"], rtol=0.5)
    assert report.steps["step"].tolist() == list(range(14))
    summary = report.summary().iloc[0]
    assert summary["comm_share"] > 0 and summary["compute_ms"] > 0


def test_captured_window_opens_in_xprof_with_steps_detected(four_replica_run):
    log_dir, _ = four_replica_run
    steps = xprof_step_table(find_traces(log_dir)[0])
    assert steps["step"].tolist() == [2, 3, 4, 5]
    assert (steps["xprof_step_ms"] > 0).all()


def test_breakdown_scalars_reach_tensorboard(four_replica_run):
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    log_dir, _ = four_replica_run
    multiplexer = EventMultiplexer(size_guidance={"tensors": 0})
    multiplexer.AddRunsFromDirectory(str(log_dir))
    multiplexer.Reload()
    tags = set(multiplexer.GetAccumulator("keras_dp/worker-0").Tags()["tensors"])
    assert {"dp_window/compute_ms", "dp_window/allreduce_ms", "dp_window/comm_share"} <= tags
    points = multiplexer.GetAccumulator("keras_dp/worker-0").Tensors("dp_window/compute_ms")
    assert [point.step for point in points] == [2, 3, 4, 5, 9, 10, 11, 12]


def comm_share_of(keras, strategy, log_dir, layers, features, per_replica_batch):
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((features,)), *[keras.layers.Dense(units) for units in layers]]
        )
        model.compile(optimizer="sgd", loss="mse")
    batch = per_replica_batch * strategy.num_replicas_in_sync
    x = np.ones((batch * 16, features), "float32")
    y = np.ones((batch * 16, layers[-1]), "float32")
    model.fit(
        x,
        y,
        batch_size=batch,
        epochs=1,
        verbose=0,
        callbacks=[profiled(log_dir, start_step=3, window=10)],
    )
    return kdt.Report.load(log_dir).steps["comm_share"].median()


@pytest.mark.slow
def test_comm_heavy_training_shows_a_higher_comm_share(tmp_path, keras, strategy4):
    """3M parameters and 2 examples per replica against 3k parameters and 512: the
    first spends far more of its step moving gradients."""
    heavy = comm_share_of(keras, strategy4, tmp_path / "heavy", [1536, 1024], 1024, 2)
    light = comm_share_of(keras, strategy4, tmp_path / "light", [64, 16], 32, 512)
    assert heavy > 2 * light, (heavy, light)


def test_window_moves_past_keras_tensorboard_profile_batch(tmp_path, keras, strategy4):
    board = keras.callbacks.TensorBoard(str(tmp_path), profile_batch=(3, 5))
    profiler = profiled(tmp_path, start_step=2, window=3)
    timer = kdt.StepTimer(tmp_path)

    # profile_batch counts train calls from 1: calls 3-5 are global steps 2-4.
    with pytest.warns(kdt.MeasurementWarning, match=r"moved its window past steps 2-4,") as caught:
        fit(dense_model(keras, strategy4), [board, profiler, timer], epochs=2)
    assert caught[0].filename == fit.__code__.co_filename  # the model.fit line, not ours

    report = kdt.Report.load(tmp_path)
    assert report.windows["status"].tolist() == ["foreign", "analysed"]
    foreign = report.windows.iloc[0]
    assert (foreign.start_step, foreign.end_step) == (2, 5)
    assert "TensorBoard(profile_batch=(3, 5))" in foreign.reason
    assert report.windows["start_step"].iloc[1] >= 5
    # Keras's capture slowed steps 2-4: they are left out of the step times like ours.
    steps = report.steps.set_index("step")
    assert steps.loc[[2, 3, 4], "profiled"].all() and not steps.loc[1, "profiled"]
    captures = find_traces(tmp_path)
    assert len(captures) == 2  # Keras's and ours
    # Keras 3's own capture of steps 2-4 gets step markers from ours (keras-team/keras#19476),
    # all but the edge step whose marker the other callback's start or stop cuts off.
    keras_capture = next(c for c in captures if str(c) != str(tmp_path / report.windows.trace[1]))
    assert xprof_step_table(keras_capture)["step"].tolist() in ([2, 3], [3, 4])


def test_window_is_skipped_while_another_session_profiles(tmp_path, keras, strategy4, tf):
    tf.profiler.experimental.start(str(tmp_path / "theirs"))
    try:
        with pytest.warns(kdt.MeasurementWarning, match="another profiler session"):
            history = fit(dense_model(keras, strategy4), [profiled(tmp_path)])
    finally:
        tf.profiler.experimental.stop()

    assert len(history.history["loss"]) == 1
    windows = kdt.Report.load(tmp_path).windows
    assert windows["status"].tolist() == ["skipped"]
    assert "another profiler session" in windows["reason"].iloc[0]


def test_tf_keras_steps_are_numbered_globally(tmp_path, tf_keras, strategy4):
    fit(dense_model(tf_keras, strategy4), [profiled(tmp_path, start_step=8)], epochs=2)

    report = kdt.Report.load(tmp_path)
    assert report.windows["status"].tolist() == ["analysed"]
    # tf_keras marks steps 1..3 of epoch 2 itself; ours carry the global numbers.
    assert report.replicas["step"].unique().tolist() == [8, 9, 10, 11]


def test_failed_analysis_warns_and_training_goes_on(tmp_path, keras, strategy4, monkeypatch):
    def broken(*args, **kwargs):
        raise ValueError("trace unreadable")

    # Every window goes to the child process, whose launcher here stands in for it.
    from keras_dp_tools.analysis import runner

    monkeypatch.setattr(runner, "CHILD_PROCESS_MIN_BYTES", 0)
    monkeypatch.setattr(runner, "analyze_in_child", broken)
    model = dense_model(keras, strategy4)
    with pytest.warns(kdt.MeasurementWarning, match="could not analyse"):
        fit(model, [profiled(tmp_path, every=4)], epochs=2)

    assert iterations(model) == 14
    windows = kdt.Report.load(tmp_path).windows
    assert set(windows["status"]) == {"failed"}
    assert windows["reason"].str.contains("trace unreadable").all()


def test_crash_inside_a_window_keeps_the_capture(tmp_path, keras, strategy4):
    class Crash(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 3:
                raise RuntimeError("user code failed")

    profiler = profiled(tmp_path)
    model = dense_model(keras, strategy4)
    with pytest.raises(RuntimeError, match="user code failed"):
        fit(model, [profiler, Crash()])
    # Keras calls no hook after a crash: the profiler's next fit (or the process's
    # exit) closes the open window, and its steps are still analysed.
    fit(model, [profiler])

    report = kdt.Report.load(tmp_path)
    assert report.windows["status"].tolist() == ["analysed"]
    assert report.replicas["step"].unique().tolist() == [2, 3]
    assert not [t for t in threading.enumerate() if t.name.startswith("keras_dp_analysis")]


def test_invalid_arguments_name_the_value(tmp_path):
    with pytest.raises(ValueError, match="received 0"):
        kdt.DataParallelProfiler(tmp_path, window=0)
    with pytest.raises(ValueError, match="windows would overlap"):
        kdt.DataParallelProfiler(tmp_path, window=5, every=3)
    with pytest.raises(ValueError, match="start_step must be an integer >= 0, received -1"):
        kdt.DataParallelProfiler(tmp_path, start_step=-1)


def test_analysis_child_process_matches_and_raises_like_analyze_trace(tmp_path, tf):
    from keras_dp_tools.analysis import analyze_trace
    from keras_dp_tools.analysis.runner import analyze_in_child
    from keras_dp_tools.records.facts import RunFacts
    from tests.helpers.xplane_builder import SpaceBuilder

    builder = SpaceBuilder().step(1, 0, 10).step(2, 10, 20)
    for replica in range(2):
        scope = f"replica_{replica}/" if replica else ""
        for start in (0, 10):
            builder.host().event(
                f"tf_Compute/{replica}", f"{scope}d/MatMul:MatMul", start + 1, start + 6
            )
    trace = builder.write(tmp_path)
    in_child = analyze_in_child(trace, RunFacts(allreduce_bytes=64))
    here = analyze_trace(trace, allreduce_bytes=64)
    assert in_child.replicas.equals(here.replicas) and in_child.steps.equals(here.steps)
    assert in_child.replicas["compute_ms"].tolist() == pytest.approx([5.0] * 4)

    corrupt = tmp_path / "corrupt.xplane.pb"
    corrupt.write_bytes(b"not a protobuf")
    with pytest.raises(ValueError, match="is not an XSpace profile"):
        analyze_in_child(corrupt, RunFacts())
