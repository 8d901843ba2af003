"""The callback base: both Keras protocols, and the never-stop-training guard. No TensorFlow."""

import warnings

import pytest

from keras_dp_tools import DataParallelCallback, MeasurementWarning


class Counting(DataParallelCallback):
    def __init__(self):
        super().__init__()
        self.calls = 0
        self.cleaned_up = False

    def on_train_batch_end(self, batch, logs=None):
        self.calls += 1
        if batch == 2:
            raise OSError("disk full")

    def _on_failure(self):
        self.cleaned_up = True


def test_only_overridden_hooks_count_as_implemented():
    plain, counting = DataParallelCallback(), Counting()

    assert not plain._implements_train_batch_hooks()
    assert counting._implements_train_batch_hooks()
    assert not counting._implements_test_batch_hooks()
    assert not counting._implements_predict_batch_hooks()
    assert getattr(plain.on_train_batch_end, "_is_default", False)  # read by Keras 3 too
    assert not getattr(counting.on_train_batch_end, "_is_default", False)


def test_default_hooks_accept_both_calling_conventions():
    callback = DataParallelCallback()
    callback.on_train_begin()
    callback.on_train_begin(logs={})
    callback.on_epoch_end(0, {"loss": 1.0})
    callback.on_train_batch_end(3, logs=None)


def test_a_raising_hook_warns_once_then_goes_quiet():
    callback = Counting()

    with pytest.warns(
        MeasurementWarning, match=r"Counting stopped measuring .*OSError: disk full"
    ) as caught:
        for batch in range(5):
            callback.on_train_batch_end(batch)
    assert caught[0].filename == __file__  # the caller's line, not the base class's

    assert callback.failed and callback.cleaned_up
    assert callback.calls == 3  # batches 0, 1 and the failing 2; none after
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        callback.on_train_batch_end(6)


def test_keyboard_interrupt_is_not_swallowed():
    class Interrupted(DataParallelCallback):
        def on_epoch_end(self, epoch, logs=None):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        Interrupted().on_epoch_end(0)


def test_hooks_see_the_model_and_params_keras_hands_over():
    class Reads(DataParallelCallback):
        def on_train_begin(self, logs=None):
            self.seen = (self.model, self.params["epochs"])

    callback, model = Reads(), object()
    callback.set_model(model)
    callback.set_params({"epochs": 2})
    callback.on_train_begin()

    assert callback.seen[0] is model and callback.seen[1] == 2
