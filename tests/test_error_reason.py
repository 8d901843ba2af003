"""A failed trial's reason in one line: the exception's type and its own message, no
terminal escapes, cut at a word. The messages are as TensorFlow 2.21 / Keras 3 raised
them (copied from real runs)."""

from keras_dp_tools.common.text import error_reason, shortened

# CentralStorageStrategy fitting a model with BatchNormalization (str() of the ValueError).
CENTRAL_STORAGE_BATCHNORM = (
    "Exception encountered when calling BatchNormalization.call().\n\n\x1b[1mYou must "
    "specify an aggregation method to update a AggregatingVariable in Replica Context. You "
    "can do so by passing an explicit value for argument `aggregation` to tf.Variable(..)."
    "e.g. `tf.Variable(..., aggregation=tf.VariableAggregation.SUM)``tf.VariableAggregation` "
    "lists the possible aggregation methods.This is required because AggregatingVariable "
    "should always be kept in sync. When updating them or assigning to them in a replica "
    "context, we automatically try to aggregate the values before updating the variable. "
    "For this aggregation, we need to know the aggregation method. Another alternative is "
    "to not try to update such AggregatingVariable in replica context, but in cross replica "
    "context. You can enter cross replica context by calling "
    "`tf.distribute.get_replica_context().merge_call(merge_fn, ..)`.Inside `merge_fn`, you "
    "can then update the AggregatingVariable using `tf.distribute.StrategyExtended.update()`."
    "\x1b[0m\n\nArguments received by BatchNormalization.call():\n  • inputs=tf.Tensor("
    "shape=(16, 8), dtype=float32)\n  • training=True\n  • mask=None"
)
# A tf.function's error quotes the user's traceback before the exception's own line.
IN_USER_CODE = (
    'in user code:\n\n    File "train.py", line 12, in train_step  *\n        loss = '
    'model(x)\n\n    ValueError: Input 0 of layer "dense" is incompatible with the layer: '
    "expected axis -1 of input shape to have value 8, but received input with shape (16, 4)"
)


def test_a_keras_error_keeps_its_type_and_cause_without_escapes_or_arguments():
    reason = error_reason(ValueError(CENTRAL_STORAGE_BATCHNORM), limit=300)
    assert reason.startswith(
        "ValueError: Exception encountered when calling BatchNormalization.call(). "
        "You must specify an aggregation method"
    )
    assert "\x1b" not in reason and "[0m" not in reason and "Arguments received" not in reason
    assert len(reason) <= 300 and reason.endswith("…")
    last = reason[:-1].split()[-1]  # a whole word (less a trailing comma), not cut inside
    assert any(word.rstrip(",") == last for word in CENTRAL_STORAGE_BATCHNORM.split())


def test_the_quoted_exception_line_of_a_traceback_is_the_reason():
    reason = error_reason(ValueError(IN_USER_CODE))
    assert reason.startswith('ValueError: Input 0 of layer "dense" is incompatible')
    assert "train.py" not in reason
    # A reason already written as "Type: message" (a trial's answer) reads the same.
    assert error_reason(f"ValueError: {IN_USER_CODE}") == reason


def test_short_reasons_are_kept_whole():
    assert error_reason(RuntimeError("this model refuses central storage")) == (
        "RuntimeError: this model refuses central storage"
    )
    assert error_reason("timed out after 30 s") == "timed out after 30 s"
    assert shortened("one two three", 9) == "one two…"
