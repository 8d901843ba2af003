"""A failed trial's reason in one line: the exception's type and its own message, no
terminal escapes, cut at a word. The messages are as TensorFlow 2.21 / Keras 3 raised
them (copied from real runs)."""

from keras_dp_tools.common.text import error_reason, shortened, without_escapes

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

# A shape error inside a tf.function (str() of the InvalidArgumentError).
GRAPH_EXECUTION = (
    "Graph execution error:\n\nDetected at node Add defined at (most recent call last):\n  File "
    '"<string>", line 10, in <module>\n\n  File "<string>", line 8, in g\n\n  File "<string>", '
    "line 4, in f\n\nIncompatible shapes: [32,1] vs. [16,1]\n\t [[{{node Add}}]] "
    "[Op:__inference_g_22]"
)


class InvalidArgumentError(Exception):  # tf.errors' class name, without TensorFlow
    pass


def test_a_keras_error_keeps_its_type_and_cause_without_escapes_or_arguments():
    reason = error_reason(ValueError(CENTRAL_STORAGE_BATCHNORM), limit=300)
    assert reason.startswith(
        "ValueError: Exception encountered when calling BatchNormalization.call(). "
        "You must specify an aggregation method"
    )
    assert "\x1b" not in reason and "[0m" not in reason and "Arguments received" not in reason
    assert len(reason) <= 300 and reason.endswith("…")
    flat = " ".join(without_escapes(CENTRAL_STORAGE_BATCHNORM).split())
    whole = f"ValueError: {flat}"
    kept = reason[:-1]  # less the ellipsis: cut between two words (a trailing comma dropped)
    assert whole.startswith(kept) and whole[len(kept)] in " ,;:"


def test_the_quoted_exception_line_of_a_traceback_is_the_reason():
    reason = error_reason(ValueError(IN_USER_CODE))
    assert reason.startswith('ValueError: Input 0 of layer "dense" is incompatible')
    assert "train.py" not in reason
    # A reason already written as "Type: message" (a trial's answer) reads the same.
    assert error_reason(f"ValueError: {IN_USER_CODE}") == reason


def test_a_graph_errors_cause_follows_its_quoted_frames():
    reason = error_reason(InvalidArgumentError(GRAPH_EXECUTION))
    assert reason == (
        "InvalidArgumentError: Graph execution error: Incompatible shapes: [32,1] vs. [16,1]"
    )


def test_exception_names_in_a_message_without_a_traceback_are_its_text():
    reason = error_reason(ValueError("Expected one of:\n  KeyError: a key\nbut got neither"))
    assert reason == "ValueError: Expected one of: KeyError: a key but got neither"


def test_short_reasons_are_kept_whole():
    assert error_reason(RuntimeError("this model refuses central storage")) == (
        "RuntimeError: this model refuses central storage"
    )
    assert error_reason("timed out after 30 s") == "timed out after 30 s"
    assert shortened("one two three", 9) == "one two…"
    assert shortened("one two three four", 8) == "one two…"  # "one two" fits before the cut
    assert error_reason(ValueError("\x1b[1m\x1b[0m")) == "ValueError"
