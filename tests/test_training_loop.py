"""kdt.TrainingLoop on custom training loops (strategy.run) over 4 logical CPU devices,
and the eager-strategy.run finding (analysis.loop_advice)."""

import statistics
import subprocess
import sys
import warnings

import numpy as np
import pandas as pd
import pytest

import keras_dp_tools as kdt
from keras_dp_tools.analysis import find_traces
from keras_dp_tools.analysis.breakdown.xprof_steps import xprof_step_table
from keras_dp_tools.analysis.loop_advice import FIX, FIX_RUN_EAGERLY, eager_loop_findings
from keras_dp_tools.analysis.record_tables import records_by_type
from keras_dp_tools.records.reader import find_record_files
from tests.helpers import REPO
from tests.helpers.doc_blocks import python_block, run_example
from tests.helpers.processes import run_cli

PER_REPLICA = 8


def training_loop_records(log_dir) -> pd.DataFrame:
    files = [(path, 0) for path in find_record_files(log_dir)]
    return records_by_type(files).get("training_loop")


def custom_loop(tf, keras, strategy, eager=False):
    """A model, its distributed dataset and the distributed step: inside a
    tf.function, or called eagerly (the mistake)."""
    global_batch = PER_REPLICA * strategy.num_replicas_in_sync
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)]
        )
        optimizer = keras.optimizers.SGD(0.01)
    x = np.random.default_rng(0).normal(size=(global_batch * 40, 8)).astype("float32")
    dataset = tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1, keepdims=True)))
    batches = strategy.experimental_distribute_dataset(dataset.batch(global_batch).repeat())

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            per_example = keras.losses.mean_squared_error(y, model(x, training=True))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        return loss

    def distributed_step(x, y):
        losses = strategy.run(replica_step, args=(x, y))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    step = distributed_step if eager else tf.function(distributed_step)
    model.test_optimizer = optimizer  # for tests that count its steps
    return model, iter(batches), step, global_batch


# -- the finding (pure) --------------------------------------------------------


def loop_record(step_function, replicas=4, run="r1", worker=0, steps=50, eager=50):
    return {
        "type": "training_loop",
        "run": run,
        "worker": worker,
        "time": 2.0,
        "status": "finished",
        "step_function": step_function,
        "step": 0,
        "steps": steps,
        "eager_steps": eager if step_function != "tf.function" else 0,
        "first_eager_step": 0 if step_function != "tf.function" else None,
        "replicas": replicas,
    }


def test_eager_loop_is_an_error_with_the_tf_function_fix_and_the_step_time():
    loops = pd.DataFrame([loop_record("eager")])
    # Warm-up and profiled steps are left out: the median of 10, 30, 20 is 20.
    steps = pd.DataFrame(
        {
            "run": ["r1"] * 5 + ["r2"],
            "worker": [0] * 6,
            "step_ms": [900.0, 10.0, 30.0, 500.0, 20.0, 1.0],
            "warmup": [True, False, False, False, False, False],
            "profiled": [False, False, False, True, False, False],
        }
    )
    [finding] = eager_loop_findings(loops, steps)
    assert finding.severity == kdt.Severity.ERROR and finding.code == "eager-strategy-run"
    assert finding.fix == FIX and "tf.function" in finding.fix
    assert "4 replicas one after another" in finding.evidence
    assert "50 of 50 steps" in finding.evidence
    assert "median step 20.0 ms over 3 timed steps" in finding.evidence


def test_a_short_eager_run_of_profiled_steps_says_its_times_are_profiled():
    steps = pd.DataFrame(
        {
            "run": ["r1"] * 3,
            "worker": [0] * 3,
            "step_ms": [900.0, 400.0, 420.0],
            "warmup": [True, False, False],
            "profiled": [False, True, True],
        }
    )
    [finding] = eager_loop_findings(pd.DataFrame([loop_record("eager")]), steps)
    assert "median step 410.0 ms over 2 timed steps, all profiled" in finding.evidence


def test_loop_in_a_tf_function_or_no_loop_has_no_finding():
    assert eager_loop_findings(pd.DataFrame([loop_record("tf.function")])) == []
    assert eager_loop_findings(pd.DataFrame([loop_record("unknown")])) == []
    assert eager_loop_findings(None) == []  # a fit: no training_loop record


def test_latest_record_counts_and_run_functions_eagerly_gets_its_own_fix():
    first = {**loop_record("tf.function"), "time": 1.0, "status": "running"}
    later = {**loop_record("run_functions_eagerly"), "time": 2.0}
    [finding] = eager_loop_findings(pd.DataFrame([later, first]))  # any order
    assert finding.fix == FIX_RUN_EAGERLY
    assert "run_functions_eagerly(True) was on" in finding.evidence
    # The same run with its last record a tf.function: nothing.
    assert eager_loop_findings(pd.DataFrame([{**later, "time": 0.5}, first])) == []


def test_one_replica_eager_loop_is_a_warning_not_serial_replicas():
    [finding] = eager_loop_findings(pd.DataFrame([loop_record("eager", replicas=1)]))
    assert finding.severity == kdt.Severity.WARNING
    assert "one after another" not in finding.evidence


# -- real loops -------------------------------------------------------------------


@pytest.fixture(scope="module")
def function_loop(tmp_path_factory, tf, keras, strategy4):
    """A tf.function loop of 12 steps, a profiler window over steps 3-7."""
    log_dir = tmp_path_factory.mktemp("loop")
    model, batches, train_step, global_batch = custom_loop(tf, keras, strategy4)
    with kdt.TrainingLoop(
        log_dir,
        strategy4,
        model,
        global_batch=global_batch,
        profile_start_step=3,
        monitor=False,
    ) as loop:
        for _ in range(12):
            with loop.step():
                train_step(*next(batches))
    return log_dir, loop, kdt.Report.load(log_dir)


def test_loop_steps_reach_the_report_and_its_summary(function_loop):
    _, loop, report = function_loop
    assert report.steps["step"].tolist() == list(range(12))
    assert report.steps["warmup"].tolist() == [True] + [False] * 11
    assert (report.runs["global_batch"] == PER_REPLICA * 4).all()
    summary = report.summary().iloc[0]
    assert summary["steps"] >= 11 and summary["replicas"] == 4
    assert loop.step_function() == "tf.function"
    assert str(report.runs["keras_package"].iloc[0]) == "keras"


def test_profiled_window_breaks_loop_steps_into_compute_and_allreduce(function_loop):
    log_dir, _, report = function_loop
    assert report.windows["status"].tolist()[-1] == "analysed"
    replicas = report.replicas
    assert replicas["step"].unique().tolist() == [3, 4, 5, 6, 7]
    assert sorted(replicas["replica"].unique()) == [0, 1, 2, 3]
    assert (replicas["compute_ms"] > 0).all() and (replicas["allreduce_ms"] > 0).all()
    # The step markers as XProf reads them, on the same capture: the same five steps.
    assert xprof_step_table(find_traces(log_dir)[0])["step"].tolist() == [3, 4, 5, 6, 7]


def test_function_loop_records_no_eager_run(function_loop):
    log_dir, _, report = function_loop
    loops = training_loop_records(log_dir)
    last = loops.sort_values("time").iloc[-1]
    assert last["step_function"] == "tf.function" and last["eager_steps"] == 0
    assert last["steps"] == 12 and last["status"] == "finished"
    assert eager_loop_findings(loops, report.steps) == []


@pytest.mark.slow
def test_eager_loop_is_found_with_its_recorded_step_times_and_the_function_loop_is_not(
    tmp_path, tf, keras, strategy4
):
    """The two loops' steps interleaved on one strategy: the finding fires for the
    eager one only, and its evidence gives the median of the eager run's own step
    records (warm-up left out), worked out here from the records file."""
    runs = {}
    for name, eager in (("eager", True), ("function", False)):
        model, batches, step, global_batch = custom_loop(tf, keras, strategy4, eager=eager)
        loop = kdt.TrainingLoop(
            tmp_path / name,
            strategy4,
            model,
            global_batch=global_batch,
            profile=False,
            monitor=False,
            tensorboard=False,
        )
        runs[name] = (loop, batches, step, [])
    for loop, *_ in runs.values():
        loop.begin()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TensorFlow's own eager warning
        for _ in range(12):
            for loop, batches, step, _times in runs.values():
                with loop.step():
                    float(step(*next(batches)))
    for loop, *_ in runs.values():
        loop.end()

    # The step records as written (not the Report): 12 steps, the first a warm-up.
    [records] = [pd.read_json(path, lines=True) for path in find_record_files(tmp_path / "eager")]
    steps = records[records["type"] == "step"]
    assert len(steps) == 12 and steps["warmup"].tolist() == [True] + [False] * 11
    steady = steps.loc[~steps["warmup"].astype(bool), "step_ms"]
    [finding] = eager_loop_findings(
        training_loop_records(tmp_path / "eager"), kdt.Report.load(tmp_path / "eager").steps
    )
    assert finding.severity == kdt.Severity.ERROR and "12 of 12 steps" in finding.evidence
    assert f"median step {statistics.median(steady):.1f} ms over 11 timed steps" in (
        finding.evidence
    )
    assert runs["eager"][0].step_function() == "eager"
    assert eager_loop_findings(training_loop_records(tmp_path / "function")) == []
    assert "run" not in vars(strategy4)  # the strategy is given back its own run


def test_wrapped_step_and_epochs_number_steps_as_fit_does(tmp_path, tf, keras, strategy4):
    model, batches, train_step, global_batch = custom_loop(tf, keras, strategy4)
    with kdt.TrainingLoop(
        tmp_path, strategy4, model, global_batch=global_batch, profile=False, monitor=False
    ) as loop:
        measured_step = loop.wrap(train_step)
        for epoch in range(2):
            with loop.epoch(epoch):
                for _ in range(3):
                    measured_step(*next(batches))
    report = kdt.Report.load(tmp_path)
    steps = report.steps
    assert steps["epoch"].tolist() == [0, 0, 0, 1, 1, 1]
    assert steps["step"].tolist() == list(range(6))
    # A loop's data is not read: the throughput counts the global batch it was given.
    assert report.runs["global_batch_source"].tolist() == ["argument"]
    assert steps["examples_per_s"].notna().all()
    assert int(model.test_optimizer.iterations.numpy()) == 6


def test_step_inside_a_tf_function_warns_and_measures_nothing(tmp_path, tf, keras, strategy4):
    model = custom_loop(tf, keras, strategy4)[0]
    with kdt.TrainingLoop(tmp_path, strategy4, model, callbacks=[]) as loop:

        @tf.function
        def traced():
            with loop.step():
                return tf.constant(1.0)

        with pytest.warns(kdt.MeasurementWarning, match="inside a tf.function"):
            traced()
    assert loop.step_function() == "unknown"


def test_a_failing_measurement_warns_once_and_the_loop_trains_on(
    tmp_path, tf, keras, strategy4, monkeypatch
):
    from keras_dp_tools.capture import training_loop

    def refuse(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(training_loop.Recorder, "for_fit", refuse)
    model, batches, train_step, _ = custom_loop(tf, keras, strategy4)
    with (
        pytest.warns(kdt.MeasurementWarning, match="disk full") as caught,
        kdt.TrainingLoop(tmp_path, strategy4, model, callbacks=[]) as loop,
    ):
        for _ in range(3):
            with loop.step():
                train_step(*next(batches))
    assert len([w for w in caught if "TrainingLoop" in str(w.message)]) == 1
    assert int(model.test_optimizer.iterations.numpy()) == 3  # every step trained
    assert loop.step_function() == "tf.function"  # still followed, without records


def test_step_function_of_a_loop_that_raised_keeps_the_error(tmp_path, tf, keras, strategy4):
    model, batches, train_step, _ = custom_loop(tf, keras, strategy4)
    with (
        pytest.raises(ZeroDivisionError),
        kdt.TrainingLoop(tmp_path, strategy4, model, profile=False, monitor=False) as loop,
    ):
        with loop.step():
            train_step(*next(batches))
        with loop.step():
            float(train_step(*next(batches))) / 0
    assert "run" not in vars(strategy4)
    statuses = training_loop_records(tmp_path).sort_values("time")["status"].tolist()
    assert statuses == ["running", "exited"]


@pytest.mark.slow
def test_tf_keras_example_trains_and_reports_a_profiled_window(tmp_path):
    """examples/custom_training_loop.py --tf-keras, in its own process
    (TF_USE_LEGACY_KERAS=1 must be set before TensorFlow is imported)."""
    log_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "examples/custom_training_loop.py", str(log_dir), "--tf-keras"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "tf.function steps" in done.stdout
    report = kdt.Report.load(log_dir)
    assert str(report.runs["keras_package"].iloc[0]) == "tf_keras"
    # Two logical CPU devices: both replicas of every profiled step, compute and all-reduce.
    assert report.replicas["step"].unique().tolist() == [10, 11, 12, 13, 14]
    assert sorted(report.replicas["replica"].unique()) == [0, 1]
    assert (report.replicas["compute_ms"] > 0).all()
    assert (report.replicas["allreduce_ms"] > 0).all()
    assert eager_loop_findings(training_loop_records(log_dir)) == []


def test_keras_dp_analyze_reads_the_loops_window(function_loop):
    log_dir, _, _ = function_loop
    done = run_cli("analyze", str(log_dir))
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line.split() for line in done.stdout.splitlines() if line.split()[:1] != ["step"]]
    steps = [int(row[0]) for row in rows if row and row[0].isdigit()]
    assert steps == [3, 4, 5, 6, 7]  # the loop's step markers, read from the capture


@pytest.mark.slow
def test_getting_started_loop_example_runs_and_reports(tmp_path):
    out = run_example(
        python_block("docs/getting-started.md", "## Measure a custom training loop"), tmp_path
    )
    assert out.splitlines()[0] == "tf.function"
    report = kdt.Report.load(tmp_path / "runs" / "loop1")
    # 2 replicas x 32 = 64 examples a step, 20 batches; a window from step 5.
    assert report.runs["global_batch"].tolist() == [64]
    assert report.steps["step"].tolist() == list(range(20))
    assert report.replicas["step"].unique().tolist() == [5, 6, 7, 8, 9]


def test_dashboard_data_layer_shows_the_loops_run(function_loop):
    from keras_dp_tools.report.tensorboard_plugin.data import LogDirData

    log_dir, _, report = function_loop
    data = LogDirData(log_dir)
    [listed] = data.runs()["runs"]
    assert listed["run"] == report.runs["run"].iloc[0] and listed["replicas"] == 4
    shown = data.run(listed["run"], None)
    assert shown.get("error") is None
    assert {"summary", "advice"} <= set(shown)
