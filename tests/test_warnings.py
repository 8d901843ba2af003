"""Our warnings point at the user's line (stacklevel), as Keras's own do."""

import warnings

import numpy as np
import pytest

import keras_dp_tools as kdt
from keras_dp_tools.common.warn import warn
from keras_dp_tools.records.writer import RecordWriter, worker_records_path


def test_a_warning_from_deep_inside_the_package_points_here(tmp_path):
    path = worker_records_path(tmp_path, 0)
    RecordWriter(path).close()
    with open(path, "a", encoding="utf-8") as file:
        file.write('{"type": "header", "run": "r", "worker": 0, "time": 1.0}\nnot json\n')

    with pytest.warns(UserWarning, match="damaged line") as caught:
        kdt.Report.load(tmp_path)  # Report -> records -> arrow fallback -> warn

    assert caught[0].filename == __file__


def _function_of(module: str, source: str, **names):
    """A function whose frames belong to ``module`` (as if defined there)."""
    namespace = {"__name__": module, **names}
    exec(compile(source, f"<{module}>", "exec"), namespace)
    return namespace["call"]


def test_the_helper_skips_package_frames_up_to_the_user():
    ours = _function_of(
        "keras_dp_tools.fake", "def call():\n    warn('x', UserWarning)\n", warn=warn
    )
    keras_hook = _function_of("keras.src.fake", "def call():\n    inner()\n", inner=ours)
    user_code = _function_of("train_script", "def call():\n    fit()\n", fit=keras_hook)

    with pytest.warns(UserWarning) as caught:
        keras_hook()  # Keras calling us: the line is this test's
    with pytest.warns(UserWarning) as from_script:
        user_code()  # a user's script calling fit: its line

    assert (caught[0].filename, from_script[0].filename) == (__file__, "<train_script>")
    assert from_script[0].lineno == 2


class FailsOnBatch(kdt.DataParallelCallback):
    def on_train_batch_end(self, batch, logs=None):
        raise OSError("disk full")


@pytest.mark.parametrize("package", ["keras", "tf_keras"])
def test_a_failing_callback_warns_at_the_fit_line(request, package):
    keras_module = request.getfixturevalue(package)
    model = keras_module.Sequential([keras_module.Input((4,)), keras_module.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x = np.zeros((16, 4), "float32")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = _next_line()
        model.fit(x, x[:, :1], batch_size=8, verbose=0, callbacks=[FailsOnBatch()])

    ours = [w for w in caught if w.category is kdt.MeasurementWarning]
    assert len(ours) == 1 and "disk full" in str(ours[0].message)
    assert (ours[0].filename, ours[0].lineno) == (__file__, line)


def _next_line() -> int:
    """The line after the caller's."""
    import sys

    return sys._getframe(1).f_lineno + 1
