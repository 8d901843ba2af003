"""Whole-fit time accounting (analysis.fit_time) and its finding (analysis.fit_time_advice).

Hand-written records with hand-computed splits; then real fits under MirroredStrategy
(4 logical CPU devices) whose time outside the steps is injected and measured by the
test's own callback (time.monotonic), independently of StepTimer."""

from __future__ import annotations

import json
import time

import numpy as np
import pandas as pd
import pytest

import keras_dp_tools as kdt
from keras_dp_tools.analysis.fit_time import (
    FIT_EDGE_TYPES,
    FIT_TIME_COLUMNS,
    OUTSIDE_PARTS,
    fit_time_by_run,
    fit_time_frame,
)
from keras_dp_tools.analysis.fit_time_advice import OUTSIDE_STEPS_SHARE_HIGH, fit_time_findings
from keras_dp_tools.analysis.record_tables import records_by_type
from keras_dp_tools.records.reader import find_record_files
from keras_dp_tools.records.writer import worker_records_path
from tests.helpers.doc_blocks import python_block, run_example
from tests.helpers.training import GLOBAL_BATCH, dense_model, regression_data

# ---------------------------------------------------------------- hand-written records


def edge(kind, at, epoch=0, **fields):
    return {"type": kind, "run": "r1", "worker": 0, "time": at, "epoch": epoch, **fields}


def step(at, step_ms, epoch, number, steps=1):
    return {
        "type": "step",
        "run": "r1",
        "worker": 0,
        "time": at,
        "epoch": epoch,
        "step": number,
        "steps": steps,
        "step_ms": step_ms,
        "warmup": number == 0,
    }


# One fit of two epochs; times in seconds from 1000, chosen by hand:
#   fit_begin 0.0, epoch 0 begins 0.2
#   calls: 1.0 (1.5 s: tracing), 2.6 (0.1 s), 2.8 (0.1 s)  -> gaps 1.0 (edge), 0.1, 0.1
#   validation 3.0 .. 4.0, epoch 0 ends 4.5
#   epoch 1 begins 4.6; calls 5.0 (0.1 s), 5.5 (0.2 s = 2 steps of 100 ms)
#                                             -> gaps 2.1 (edge, validation inside), 0.4
#   epoch 1 ends 6.0, fit_end 6.5 (finished)  -> tail 6.5 - 5.7 = 0.8 (edge)
HAND_FIT = [
    edge("fit_begin", 1000.0, epoch=None, step=0),
    edge("epoch_begin", 1000.2, step=0),
    step(1001.0, 1500.0, 0, 0),
    step(1002.6, 100.0, 0, 1),
    step(1002.8, 100.0, 0, 2),
    edge("validation_begin", 1003.0, step=3),
    edge("validation_end", 1004.0, step=3),
    edge("epoch_end", 1004.5, step=3),
    edge("epoch_begin", 1004.6, epoch=1, step=3),
    step(1005.0, 100.0, 1, 3),
    step(1005.5, 100.0, 1, 4, steps=2),
    edge("epoch_end", 1006.0, epoch=1, step=6),
    edge("fit_end", 1006.5, epoch=None, step=6, status="finished"),
]


def write_records(tmp_path, records) -> dict[str, pd.DataFrame]:
    path = worker_records_path(tmp_path, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = {"type": "header", "run": "r1", "worker": 0, "time": 999.0, "schema": 1}
    path.write_text("".join(json.dumps(record) + "\n" for record in [header, *records]))
    return records_by_type([(path, 0)])


def test_hand_written_fit_is_split_as_computed_by_hand(tmp_path):
    row = fit_time_frame(write_records(tmp_path, HAND_FIT)).iloc[0]

    # Calls: 1.5 + 0.1 + 0.1 + 0.1 + 0.2 = 2.0 s; median pace of the others 100 ms.
    expected = {
        "fit_s": 6.5,
        "train_calls_s": 2.0,
        "first_step_s": 1.4,  # 1.5 s - 1 step at 100 ms
        "profiler_stop_s": 0.0,
        "in_steps_s": 0.6,
        "outside_steps_s": 5.9,
        "validation_s": 1.0,
        "between_steps_s": 0.1 + 0.1 + 0.4,
        "epoch_setup_s": 1.0 + 2.1 + 0.8 - 1.0,  # edge gaps less the validation
        "epoch_start_s": (1.0 - 0.2) + (5.0 - 4.6),  # epoch_begin to the first call
        "epoch_end_s": (4.5 - 2.9) + (6.0 - 5.7) - 1.0,  # last call to epoch_end
        "steps": 6,
        "epochs": 2,
        "steps_per_epoch": 3.0,
        "train_calls": 5,
        "validations": 1,
        "outside_ms_per_step": 5900.0 / 6,
    }
    assert row["status"] == "finished" and row["fit"] == 0
    assert {name: row[name] for name in expected} == pytest.approx(expected, abs=1e-6)
    assert row["outside_steps_share"] == pytest.approx(5.9 / 6.5)


def test_a_profiler_stop_is_taken_out_of_the_gap_it_fell_in(tmp_path):
    def window(end_step, stop_ms):
        fields = {"window": end_step, "start_step": 1, "status": "analysed"}
        return edge("window", 1001.0, end_step=end_step, stop_ms=stop_ms, **fields)

    # Stopped before the call at step 2 (a 0.1 s gap between steps); step 99 is not in
    # this fit (a window closed when some other fit ended).
    windows = [window(2, 50.0), window(99, 500.0)]
    row = fit_time_frame(write_records(tmp_path, HAND_FIT + windows)).iloc[0]

    assert row["profiler_stop_s"] == pytest.approx(0.05)
    assert row["between_steps_s"] == pytest.approx(0.6 - 0.05)
    assert row["outside_steps_s"] == pytest.approx(5.9)  # the same wall time, named


def test_only_finished_fits_are_accounted_and_each_fit_gets_a_row(tmp_path):
    later = [
        # A second fit that raised (fit_end written at exit), a third that was killed.
        edge("fit_begin", 1010.0, epoch=None, step=6),
        step(1010.5, 100.0, 0, 6),
        edge("fit_end", 1050.0, epoch=None, step=7, status="exited"),
        edge("fit_begin", 1060.0, epoch=None, step=7),
        step(1060.5, 100.0, 0, 7),
    ]
    frame = fit_time_frame(write_records(tmp_path, HAND_FIT + later))

    assert list(frame.columns) == FIT_TIME_COLUMNS
    assert frame["fit"].tolist() == [0, 1, 2]
    assert frame["status"].tolist() == ["finished", "exited", "unended"]
    assert frame.loc[1:, ["fit_s", "outside_steps_s"]].isna().all().all()
    by_run = fit_time_by_run(frame)
    assert by_run.loc["r1"].to_dict() == pytest.approx(
        {"fit_s": 6.5, "outside_steps_share": 5.9 / 6.5}
    )


def test_records_without_fit_edges_give_no_rows(tmp_path):
    steps = [record for record in HAND_FIT if record["type"] == "step"]
    frame = fit_time_frame(write_records(tmp_path, steps))
    assert frame.empty and list(frame.columns) == FIT_TIME_COLUMNS
    assert fit_time_findings(frame) == []


def test_a_fit_edge_with_a_wrong_type_is_refused_on_read(tmp_path):
    with pytest.raises(ValueError, match="wrong types"):
        write_records(tmp_path, [edge("epoch_begin", 1000.0, epoch="first")])


# ---------------------------------------------------------------- the finding, by hand


def fit_row(**parts):
    """One finished fit of 100 steps in 10 s with the given parts outside the steps."""
    parts = {**dict.fromkeys(OUTSIDE_PARTS, 0.0), **parts}
    outside = sum(parts.values())
    row = {"run": "r1", "worker": 0, "status": "finished", "fit_s": 10.0, "steps": 100}
    row.update(epochs=2, validations=2, in_steps_s=10.0 - outside, outside_steps_s=outside)
    return pd.DataFrame([{**row, **parts}])


def test_finding_fires_from_the_threshold_with_the_largest_part_and_its_fix():
    share = OUTSIDE_STEPS_SHARE_HIGH
    assert fit_time_findings(fit_row(validation_s=10 * share - 0.01)) == []

    (finding,) = fit_time_findings(fit_row(validation_s=2.0, epoch_setup_s=0.5))
    assert finding.code == "time-outside-steps" and str(finding.severity) == "warning"
    assert "Largest that training can change: validation" in finding.evidence
    assert "validation_freq" in finding.fix and "1.00 s" in finding.fix  # 2 validations
    assert finding.explains_ms_per_step == pytest.approx(25.0)  # 2.5 s over 100 steps
    assert "25.0 ms per step over 100 steps" in finding.evidence


@pytest.mark.parametrize(
    ("part", "words"),
    [
        ("epoch_setup_s", "Each epoch has only 50 steps"),
        ("between_steps_s", "steps_per_execution"),
    ],
)
def test_each_largest_part_gets_its_fix(part, words):
    (finding,) = fit_time_findings(fit_row(**{part: 3.0, "validation_s": 0.5}))
    assert words in finding.fix


def test_steps_per_execution_is_not_advised_where_keras_3_fails_with_it():
    rows = fit_row(between_steps_s=3.0)
    runs = pd.DataFrame([{"run": "r1", "keras_package": "keras", "replicas": 4}])
    (keras3,) = fit_time_findings(rows, runs)
    (tf_keras,) = fit_time_findings(rows, runs.assign(keras_package="tf_keras"))
    assert "Keras 3 fails fit with it" in keras3.fix
    assert "compile(steps_per_execution=N)." in tf_keras.fix
    assert "fails" not in tf_keras.fix


def test_tracing_alone_over_the_threshold_is_info_with_its_own_fix():
    (finding,) = fit_time_findings(fit_row(first_step_s=3.0, epoch_setup_s=0.5))
    assert str(finding.severity) == "info"
    assert "amortises" in finding.fix
    assert finding.explains_ms_per_step == pytest.approx(30.0)
    # With as much outside the steps besides tracing, the fix is for that part.
    (finding,) = fit_time_findings(fit_row(first_step_s=3.0, epoch_setup_s=2.5))
    assert str(finding.severity) == "warning" and "epoch" in finding.fix


def test_our_profilers_stops_are_not_blamed_on_the_training():
    (finding,) = fit_time_findings(
        fit_row(profiler_stop_s=2.0, first_step_s=0.4, between_steps_s=0.5)
    )
    assert str(finding.severity) == "info"
    assert "max_windows" in finding.fix
    assert finding.explains_ms_per_step == pytest.approx(20.0)


# ---------------------------------------------------------------- real fits


def stopwatch(keras):
    """A callback that times the fit's hooks with its own clock (time.monotonic); put it
    first, so each of its hooks runs next to StepTimer's."""

    class Stopwatch(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.marks: dict[str, list[float]] = {}

        def _mark(self, name):
            self.marks.setdefault(name, []).append(time.monotonic())

        def on_train_begin(self, logs=None):
            self._mark("train_begin")

        def on_train_end(self, logs=None):
            self._mark("train_end")

        def on_train_batch_begin(self, batch, logs=None):
            self._mark("batch_begin")

        def on_train_batch_end(self, batch, logs=None):
            self._mark("batch_end")

        def on_test_begin(self, logs=None):
            self._mark("test_begin")

        def on_test_end(self, logs=None):
            self._mark("test_end")

        def span(self, begin, end) -> float:
            return float(np.sum(np.subtract(self.marks[end], self.marks[begin])))

    return Stopwatch()


def sleeper(keras, hook, seconds):
    """A callback that sleeps in ``hook`` and measures each sleep (time.monotonic)."""

    class Sleeper(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.slept: list[float] = []

    def sleep(self, *args, **kwargs):
        began = time.monotonic()
        time.sleep(seconds)
        self.slept.append(time.monotonic() - began)

    setattr(Sleeper, hook, sleep)
    return Sleeper()


def fit_time_of(log_dir) -> tuple[pd.DataFrame, dict]:
    records = records_by_type([(path, 0) for path in find_record_files(log_dir)])
    return fit_time_frame(records), records


def close(measured: float, expected: float, share: float = 0.1) -> bool:
    """Two timings of one interval by two callbacks agree within ``share`` of it."""
    return abs(measured - expected) <= share * expected


@pytest.mark.slow
def test_sleep_at_epoch_end_is_epoch_set_up_and_fires(tmp_path, keras, strategy4):
    watch, sleep = stopwatch(keras), sleeper(keras, "on_epoch_end", 0.4)
    x, y = regression_data()  # 7 steps per epoch
    model = dense_model(keras, strategy4)
    timer = kdt.StepTimer(tmp_path)
    model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=2, verbose=0, callbacks=[watch, sleep, timer])

    frame, records = fit_time_of(tmp_path)
    row = frame.iloc[0]
    assert len(frame) == 1 and row["status"] == "finished"
    assert (row["epochs"], row["steps"], row["train_calls"]) == (2, 14, 14)
    assert close(row["fit_s"], watch.span("train_begin", "train_end"))
    assert close(row["train_calls_s"], watch.span("batch_begin", "batch_end"))
    # The sleeps lie between an epoch's last step and its epoch_end (Sleeper runs first).
    assert row["epoch_end_s"] >= 0.99 * sum(sleep.slept)
    assert row["epoch_setup_s"] >= row["epoch_start_s"] + row["epoch_end_s"] - 1e-9
    assert row["validation_s"] == 0 and row["first_step_s"] > 0
    parts = row[list(OUTSIDE_PARTS)].sum()
    assert row["outside_steps_s"] == pytest.approx(parts, rel=1e-3)

    (finding,) = fit_time_findings(frame, records["header"])
    assert str(finding.severity) == "warning"
    assert "Largest that training can change: epoch set-up" in finding.evidence
    assert "Each epoch has only 7 steps" in finding.fix
    assert finding.explains_ms_per_step >= 0.99 * 1000 * sum(sleep.slept) / 14


def test_slow_validation_is_validation_and_fires(tmp_path, keras, strategy4):
    watch, slow = stopwatch(keras), sleeper(keras, "on_test_batch_end", 0.3)
    x, y = regression_data()
    model = dense_model(keras, strategy4)
    model.fit(
        x,
        y,
        batch_size=GLOBAL_BATCH,
        epochs=1,
        verbose=0,
        validation_data=(x[: 4 * GLOBAL_BATCH], y[: 4 * GLOBAL_BATCH]),  # 0.3 s a batch
        callbacks=[watch, slow, kdt.StepTimer(tmp_path)],
    )

    frame, records = fit_time_of(tmp_path)
    row = frame.iloc[0]
    assert row["validations"] == 1
    assert close(row["validation_s"], watch.span("test_begin", "test_end"))
    assert row["validation_s"] >= 0.99 * sum(slow.slept)
    (finding,) = fit_time_findings(frame, records["header"])
    assert "Largest that training can change: validation" in finding.evidence
    assert "validation_freq" in finding.fix


@pytest.mark.slow
def test_long_steps_with_little_outside_them_do_not_fire(tmp_path, keras, tf, strategy4):
    # Steps made long inside the model (a Python sleep in the graph on every replica),
    # measured by the sleep itself; the train function is traced by an earlier fit.
    slept = []

    def sleep(inputs):
        began = time.monotonic()
        time.sleep(0.04)
        slept.append(time.monotonic() - began)
        return inputs

    class SlowIdentity(keras.layers.Layer):
        def call(self, inputs):
            out = tf.py_function(sleep, [inputs], tf.float32)
            out.set_shape(inputs.shape)
            return out

    with strategy4.scope():
        model = keras.Sequential([keras.Input((8,)), SlowIdentity(), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
    # 30 steps of 40 ms or more: the fit's fixed set-up stays well under the threshold
    # also on a loaded machine.
    x, y = regression_data(GLOBAL_BATCH * 30)
    model.fit(x[: 2 * GLOBAL_BATCH], y[: 2 * GLOBAL_BATCH], batch_size=GLOBAL_BATCH, verbose=0)
    slept.clear()
    watch = stopwatch(keras)
    model.fit(x, y, batch_size=GLOBAL_BATCH, verbose=0, callbacks=[watch, kdt.StepTimer(tmp_path)])

    frame, records = fit_time_of(tmp_path)
    row = frame.iloc[0]
    assert row["steps"] == 30
    assert close(row["fit_s"], watch.span("train_begin", "train_end"))
    # Each step waited for its replicas' sleeps: at least the shortest sleep per step.
    assert row["in_steps_s"] >= 0.99 * 30 * min(slept)
    assert close(row["train_calls_s"], watch.span("batch_begin", "batch_end"))
    assert row["outside_steps_share"] < OUTSIDE_STEPS_SHARE_HIGH
    assert fit_time_findings(frame, records["header"]) == []


@pytest.mark.slow
def test_tf_keras_fit_records_its_edges_and_validation(tmp_path, tf_keras, strategy4):
    watch, sleep = stopwatch(tf_keras), sleeper(tf_keras, "on_epoch_end", 0.3)
    x, y = regression_data()
    model = dense_model(tf_keras, strategy4)
    model.fit(
        x,
        y,
        batch_size=GLOBAL_BATCH,
        epochs=2,
        verbose=0,
        validation_data=(x, y),
        callbacks=[watch, sleep, kdt.StepTimer(tmp_path)],
    )

    frame, _ = fit_time_of(tmp_path)
    row = frame.iloc[0]
    assert (row["epochs"], row["steps"], row["validations"]) == (2, 14, 2)
    assert close(row["fit_s"], watch.span("train_begin", "train_end"))
    assert close(row["validation_s"], watch.span("test_begin", "test_end"))
    assert row["epoch_setup_s"] >= 0.99 * sum(sleep.slept)


def test_evaluate_outside_fit_writes_no_validation_records(tmp_path, keras, strategy4):
    x, y = regression_data(GLOBAL_BATCH * 2)
    model = dense_model(keras, strategy4)
    timer = kdt.StepTimer(tmp_path)
    model.fit(x, y, batch_size=GLOBAL_BATCH, verbose=0, callbacks=[timer])
    model.evaluate(x, y, batch_size=GLOBAL_BATCH, verbose=0, callbacks=[timer])

    _, records = fit_time_of(tmp_path)
    assert "validation_begin" not in records
    assert {"fit_begin", "epoch_begin", "epoch_end", "fit_end"} <= set(records)


def test_docs_example_reads_a_recorded_fit(tmp_path):
    write_records(tmp_path / "logs" / "run1", HAND_FIT)
    out = run_example(python_block("docs/report.md", "### Time outside the steps"), tmp_path)

    assert "[warning] 91% of fit's time is outside the training steps" in out
    assert "Largest that training can change: epoch set-up" in out
    assert "6.5" in out and "0.91" in out  # fit_s, outside_steps_share


def test_a_fit_that_raised_is_exited_and_the_next_fit_is_accounted(tmp_path, keras, strategy4):
    class Stop(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            raise RuntimeError("stopped by the test")

    x, y = regression_data()
    model = dense_model(keras, strategy4)
    timer = kdt.StepTimer(tmp_path)
    with pytest.raises(RuntimeError, match="stopped by the test"):
        model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=2, verbose=0, callbacks=[timer, Stop()])
    model.fit(x, y, batch_size=GLOBAL_BATCH, verbose=0, callbacks=[timer])

    frame, _ = fit_time_of(tmp_path)
    assert frame["status"].tolist() == ["exited", "finished"]
    assert frame["steps"].tolist()[1] == 7 and np.isnan(frame["fit_s"].iloc[0])


def test_a_fit_without_step_records_has_its_wall_time_and_no_split():
    # Under ParameterServerStrategy tf_keras runs no batch hooks: the fit's edges are
    # recorded but no step, so what lies outside the steps is unknown, not 100%.
    edges = [
        {"type": "fit_begin", "run": "r", "worker": 0, "time": 1.0, "step": 0},
        {"type": "epoch_begin", "run": "r", "worker": 0, "time": 1.1, "epoch": 0, "step": 0},
        {"type": "epoch_end", "run": "r", "worker": 0, "time": 2.0, "epoch": 0, "step": 0},
        {"type": "fit_end", "run": "r", "worker": 0, "time": 2.5, "step": 0, "status": "finished"},
    ]
    records = {
        kind: pd.DataFrame([e for e in edges if e["type"] == kind]) for kind in FIT_EDGE_TYPES
    }

    (row,) = fit_time_frame(records).to_dict("records")

    assert row["fit_s"] == pytest.approx(1.5)
    assert np.isnan(row["outside_steps_share"]) and np.isnan(row["in_steps_s"])
    assert fit_time_findings(fit_time_frame(records)) == []
