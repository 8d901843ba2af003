"""Keras 3.4 and older do not all-reduce the gradients under MirroredStrategy
(keras-team/keras#19308): the replicas train apart. setup.cfg refuses those versions; a
user who has one anyway is told at ``fit`` and by the advice.

The fixtures are two real runs of the README quickstart (2 logical CPU replicas,
TensorFlow 2.18) recorded by our callbacks, with their profiler traces: one under Keras
3.4.1 (installed by hand with ``--no-deps``), one under Keras 3.5.0. Whether a gradient
all-reduce ran is read here from each trace itself, not from our analysis.
"""

import gzip
import warnings

import pytest

import keras_dp_tools as kdt
from keras_dp_tools.common.known_bugs import drops_gradient_allreduce
from tests.helpers import REPO

RUNS = REPO / "tests" / "fixtures" / "keras_versions"


def all_reduce_ops(version: str) -> int:
    """CollectiveReduceV2 op events in the run's trace (TF names an op `<name>:<type>`)."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    space.ParseFromString(
        gzip.decompress((RUNS / version / "trace" / "vm.xplane.pb.gz").read_bytes())
    )
    return sum(
        plane.event_metadata[event.metadata_id].name.endswith(":CollectiveReduceV2")
        for plane in space.planes
        for line in plane.lines
        for event in line.events
    )


def test_keras_3_4_trains_apart_and_the_advice_says_so_first(tf):
    assert all_reduce_ops("keras-3.4.1") == 0  # the bug, as the trace shows it
    report = kdt.Report.load(RUNS / "keras-3.4.1")

    # The first finding after the caveat (replicas on CPU devices share the cores).
    first = next(item for item in report.advice() if item.code != "cpu-saturated")
    assert first.code == "replicas-not-synchronised" and first.severity.name == "ERROR"
    assert "Keras 3.4.1" in first.evidence and "keras-team/keras#19308" in first.evidence
    assert "none of the 5 profiled steps" in first.evidence
    assert "keras>=3.11" in first.fix
    assert "Input-bound" not in report.text()


def test_keras_3_5_all_reduces_and_gets_no_such_finding(tf):
    assert all_reduce_ops("keras-3.5.0") == 10  # 2 replicas x 5 profiled steps
    report = kdt.Report.load(RUNS / "keras-3.5.0")

    assert "replicas-not-synchronised" not in {item.code for item in report.advice()}


@pytest.mark.parametrize(
    ("package", "version", "dropped"),
    [
        ("keras", "3.4.1", True),
        ("keras", "3.0.0", True),
        ("keras", "3.5.0", False),
        ("keras", "3.10.0", False),  # compared as numbers, not as text
        ("tf_keras", "2.17.0", False),  # the legacy Keras all-reduces
        ("keras", None, False),
    ],
)
def test_the_versions_known_to_drop_the_all_reduce(package, version, dropped):
    assert drops_gradient_allreduce(package, version) is dropped


@pytest.fixture
def keras_3_4(keras, strategy4, monkeypatch):
    """Keras reporting 3.4.1, as such an install does; strategy4 not yet warned about
    (the warning is said once per strategy object, and the session shares one)."""
    from keras_dp_tools.capture import base

    monkeypatch.setattr(keras, "__version__", "3.4.1")
    base._noted_strategies.discard(strategy4)
    yield keras
    base._noted_strategies.discard(strategy4)


def _sequential(keras):
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])


def _subclassed(keras):
    class Regressor(keras.Model):  # its module is this test's, its base Keras's
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(1)

        def call(self, inputs):
            return self.dense(inputs)

    return Regressor()


@pytest.mark.parametrize("build", [_sequential, _subclassed])
def test_fit_under_a_keras_that_drops_it_warns_before_the_first_step(keras_3_4, strategy4, build):
    with strategy4.scope():
        model = build(keras_3_4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kdt.StepTimer("unused").set_model(model)  # Keras calls it before the first step
    said = [str(w.message) for w in caught if issubclass(w.category, kdt.StrategyWarning)]
    assert len(said) == 1 and "Keras 3.4.1 does not all-reduce" in said[0]
    assert "each of the 4 replicas" in said[0]


def test_the_warning_made_an_error_does_not_stop_fit(keras_3_4, strategy4):
    with strategy4.scope():
        model = _sequential(keras_3_4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", kdt.StrategyWarning)  # the user's -W error
        kdt.StepTimer("unused").set_model(model)  # raised into fit, it would stop it
