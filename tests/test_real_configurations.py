"""The breakdown on real runs of the configurations users have beyond the demo:
steps_per_execution (tf_keras), an Embedding (sparse gradients), and
CentralStorageStrategy, on logical CPU devices. Checked against facts independent of
the analyzer: the model's sizes, the raw trace events, one configuration against
another."""

import itertools
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import keras_dp_tools as kdt
from keras_dp_tools.analysis import find_traces
from keras_dp_tools.analysis.trace.xspace import (
    host_planes,
    load_xspace,
    plane_events,
    step_markers,
)
from tests.helpers import REPO
from tests.helpers.consistency import breakdown_problems

WIDTH = 128
EXAMPLES = 32 * 24
# Across three repeats of each configuration on a loaded 2-core machine the medians of
# the same run varied by up to x1.4 (exposed wait) and the bus bandwidth 0.19-0.50 GB/s
# (x2.6), and a fresh-clone CI run saw exposed transfer differ x2.15 between the two
# configurations. The errors this guards against were larger: per-call times read as
# per-step (x4 at spe=4), pairing the wrong peers (comm share x3.3 off), bus bandwidth
# 4x too low.
SHARE_RATIO = 2.5
BANDWIDTH_RATIO = 3.0


def profile_dense(keras, strategy, log_dir, steps_per_execution):
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((64,)),
                keras.layers.Dense(WIDTH, activation="relu"),
                keras.layers.Dense(WIDTH),
                keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer="sgd", loss="mse", steps_per_execution=steps_per_execution)
    x, y = np.ones((EXAMPLES, 64), "float32"), np.ones((EXAMPLES, 1), "float32")
    profiler = kdt.DataParallelProfiler(log_dir, start_step=4, window=12 // steps_per_execution)
    model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[profiler])
    return kdt.Report.load(log_dir)


@pytest.fixture(scope="module")
def spe_runs(tmp_path_factory, tf_keras, strategy4):
    root = tmp_path_factory.mktemp("spe")
    return {
        spe: (root / str(spe), profile_dense(tf_keras, strategy4, root / str(spe), spe))
        for spe in (1, 4)
    }


def ratio(first, second):
    return max(first, second) / min(first, second)


@pytest.mark.slow
def test_steps_per_execution_gives_the_same_per_step_numbers(spe_runs):
    (_, single), (_, looped) = spe_runs[1], spe_runs[4]
    assert looped.runs["steps_per_execution"].tolist() == [4]  # was 1 under tf_keras
    assert (looped.replicas["steps"] == 4).all() and (single.replicas["steps"] == 1).all()
    parameters = 64 * WIDTH + WIDTH + WIDTH * WIDTH + WIDTH + WIDTH + 1
    for report in (single, looped):
        assert breakdown_problems(report.replicas, ranks=4) == []
        assert (report.replicas["allreduce_bytes"] == parameters * 4).all()
    assert (looped.replicas["row_bytes"] == 4 * parameters * 4).all()
    medians = [report.replicas.median(numeric_only=True) for report in (single, looped)]
    # Per step, the exchange itself is the same: what the shares measure (exposed
    # transfer and wait) and the bandwidth. The shares themselves are not: one call of
    # four steps pays the host's dispatch once (measured on a quiet machine: dispatch
    # 4.6 -> 1.2 ms, step 9.3 -> 5.0 ms, comm share 0.051 -> 0.092 at the same 0.48 ms
    # of exposed transfer), which is what steps_per_execution is for.
    for column in ("exposed_transfer_ms", "exposed_sync_wait_ms", "compute_ms"):
        assert ratio(medians[0][column], medians[1][column]) < SHARE_RATIO, column
    assert medians[1]["dispatch_ms"] < medians[0]["dispatch_ms"]
    assert ratio(medians[0]["busbw_gbps"], medians[1]["busbw_gbps"]) < BANDWIDTH_RATIO


@pytest.mark.slow
def test_raw_collective_events_add_up_to_allreduce_ms(spe_runs):
    """Per replica, the summed durations of its raw CollectiveReduceV2 events and of the
    transfers it takes part in (read off the trace by name and rendezvous key here, not by the
    analyzer) equal its allreduce_ms in every step where they do not overlap."""
    log_dir, report = spe_runs[1]
    space = load_xspace(find_traces(log_dir)[0])
    events = [event for plane in host_planes(space) for event in plane_events(plane)]
    rows = report.replicas.set_index(["step", "replica"])
    checked = 0
    for marker in step_markers(events):
        raw = {replica: [] for replica in range(4)}
        for event in events:
            if not marker.start_ps <= event.start_ps < marker.end_ps:
                continue
            if event.name.endswith(":CollectiveReduceV2"):
                suffix = event.name.split(":")[0].rsplit("CollectiveReduceV2", 1)[1]
                raw[int(suffix[1:] or 0)].append(event)
            elif event.name.endswith(":_Send"):  # its replica scope, else its receiver
                scope = re.search(r"(?:replica|update)_(\d)", event.name)
                device = event.stats["key"].split(";")[2]
                raw[int(scope.group(1) if scope else device[-1])].append(event)
        for replica, spans in raw.items():
            spans.sort(key=lambda event: event.start_ps)
            if any(b.start_ps < a.end_ps for a, b in itertools.pairwise(spans)):
                continue
            total_ms = sum(min(e.end_ps, marker.end_ps) - e.start_ps for e in spans) / 1e9
            assert rows.loc[(marker.step, replica), "allreduce_ms"] == pytest.approx(total_ms)
            checked += 1
    assert checked >= 8


VOCABULARY, DIM, SEQUENCE, BATCH = 50_000, 64, 10, 32


@pytest.mark.slow
def test_embedding_run_counts_gathered_rows_and_advises(tmp_path, keras, strategy4):
    with strategy4.scope():
        model = keras.Sequential(
            [
                keras.Input((SEQUENCE,), dtype="int32"),
                keras.layers.Embedding(VOCABULARY, DIM, name="words"),
                keras.layers.GlobalAveragePooling1D(),
                keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer="sgd", loss="mse")
    rng = np.random.default_rng(0)
    x = rng.integers(0, VOCABULARY, size=(BATCH * 6, SEQUENCE)).astype("int32")
    y = np.ones((BATCH * 6, 1), "float32")
    profiler = kdt.DataParallelProfiler(tmp_path, start_step=2, window=3)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[profiler])

    report = kdt.Report.load(tmp_path)
    replicas = report.replicas
    assert report.windows["attribution"].isna().all()  # each cond's gather placed
    assert breakdown_problems(replicas, ranks=4) == []
    assert (replicas["gather_ms"] > 0).all() and (replicas["allreduce_ms"] > 0).all()
    table_bytes = VOCABULARY * DIM * 4
    # Gathered: every lookup's row (64 floats) and its int32 index, whole batch.
    assert (replicas["gather_bytes"] == BATCH * SEQUENCE * (DIM * 4 + 4)).all()
    assert (replicas["allreduce_bytes"] == (DIM + 1) * 4).all()  # only the Dense layer
    per_step = replicas["gather_bytes"] + replicas["allreduce_bytes"]
    assert (per_step < table_bytes / 100).all()
    advice = [item for item in report.advice() if "mbedding" in item.title]
    assert advice, [item.title for item in report.advice()]
    text = str(advice[0])
    assert "words (50000x64)" in text and "CollectiveGatherV2" in text
    assert "tf.convert_to_tensor" in text


CENTRAL_STORAGE = textwrap.dedent(
    """
    import sys
    import numpy as np
    import keras_dp_tools as kdt
    kdt.configure_devices(2)
    import tensorflow as tf
    import tf_keras as keras
    strategy = tf.distribute.experimental.CentralStorageStrategy(
        ["/cpu:0", "/cpu:1"], parameter_device="/cpu:0")
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16),
                                  keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    x, y = np.ones((32 * 7, 8), "float32"), np.ones((32 * 7, 1), "float32")
    model.fit(x, y, batch_size=32, verbose=0,
              callbacks=[kdt.DataParallelProfiler(sys.argv[1], start_step=2, window=3)])
    """
)


@pytest.mark.slow
def test_central_storage_reductions_are_communication(tmp_path):
    """CentralStorageStrategy on 2 CPU devices. Seen in a capture: each replica's
    gradients go to the parameter device as _Send events (gradient_tape/replica_k/...),
    TF sums them there with a top-level AddN, and the variables come back as _Send
    events of replica_k/.../ReadVariableOp. The reduction is every replica's
    communication: each replica's all-reduce time covers the raw AddN events."""
    result = subprocess.run(
        [sys.executable, "-c", CENTRAL_STORAGE, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = kdt.Report.load(tmp_path)
    assert report.runs["strategy"].tolist() == ["CentralStorageStrategy"]
    replicas = report.replicas.set_index(["step", "replica"])
    assert breakdown_problems(report.replicas, ranks=2) == []
    space = load_xspace(find_traces(tmp_path)[0])
    events = [event for plane in host_planes(space) for event in plane_events(plane)]
    for marker in step_markers(events):
        addn = [
            event
            for event in events
            if event.name.split(":")[0].startswith("AddN")
            and event.name.endswith(":AddN")
            and marker.start_ps <= event.start_ps < marker.end_ps
        ]
        assert addn, "no reduction in the step"
        # Their union within the step (AddNs of two threads may overlap; one may run past
        # the marker, where the step's time ends), merged here by hand.
        clipped = sorted((event.start_ps, min(event.end_ps, marker.end_ps)) for event in addn)
        covered_ps, reached = 0, None
        for start, end in clipped:
            start = start if reached is None else max(start, reached)
            covered_ps += max(end - start, 0)
            reached = end if reached is None else max(reached, end)
        total_ms = covered_ps / 1e9
        for replica in (0, 1):
            assert replicas.loc[(marker.step, replica), "allreduce_ms"] >= total_ms * 0.999
            assert replicas.loc[(marker.step, replica), "sync_wait_ms"] == 0
