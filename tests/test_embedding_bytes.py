"""Bytes the embeddings' sparse gradients all-gather per step, for a Transformer text
classifier whose token and position embeddings are called inside another layer (as in
Keras's text-classification example), in Keras 3 and tf_keras."""

import pytest

import keras_dp_tools as kdt
from keras_dp_tools.capture.run_info import embedding_tables, gathered_bytes

SEQUENCE = 64
VOCABULARY = 1000
DIM = 16
GLOBAL_BATCH = 32
REPLICAS = 4
# Per looked-up row: DIM float32 values and one int32 index.
ROW_BYTES = DIM * 4 + 4
# Tokens: every example looks up SEQUENCE rows. Positions: range(SEQUENCE), looked up
# once per replica and step whatever the batch.
EXPECTED_GATHER = GLOBAL_BATCH * SEQUENCE * ROW_BYTES + REPLICAS * SEQUENCE * ROW_BYTES


def transformer_classifier(keras_module, tf):
    layers = keras_module.layers

    class TokenAndPositionEmbedding(layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.tokens = layers.Embedding(VOCABULARY, DIM)
            self.positions = layers.Embedding(SEQUENCE, DIM)

        def call(self, token_ids):
            return self.tokens(token_ids) + self.positions(tf.range(SEQUENCE))

    token_ids = keras_module.Input((SEQUENCE,), dtype="int32")
    hidden = TokenAndPositionEmbedding()(token_ids)
    hidden = layers.MultiHeadAttention(num_heads=2, key_dim=8)(hidden, hidden)
    hidden = layers.GlobalAveragePooling1D()(hidden)
    model = keras_module.Model(token_ids, layers.Dense(2)(hidden))
    model.compile(
        optimizer="adam",
        loss=keras_module.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


@pytest.mark.parametrize("flavour", ["keras", "tf_keras"])
def test_nested_embeddings_have_their_lookups_and_the_step_its_bytes(flavour, request, tf):
    model = transformer_classifier(request.getfixturevalue(flavour), tf)

    tables = sorted(embedding_tables(model), key=lambda table: table["vocabulary"])

    assert [(t["vocabulary"], t["lookups"], t["step_lookups"]) for t in tables] == [
        (SEQUENCE, 0, SEQUENCE),  # positions: no batch dimension
        (VOCABULARY, SEQUENCE, 0),  # tokens: 64 per example
    ]
    assert all(t["index_bytes"] == 4 for t in tables)  # int32 ids
    assert gathered_bytes(tables, GLOBAL_BATCH, REPLICAS) == EXPECTED_GATHER
    assert gathered_bytes(tables, GLOBAL_BATCH) is None  # per-replica rows need replicas


def test_int64_ids_take_8_bytes_an_index_and_unknown_lengths_leave_bytes_empty(tf, tf_keras):
    ids = tf_keras.Input((SEQUENCE,), dtype="int64")
    model = tf_keras.Model(ids, tf_keras.layers.Embedding(VOCABULARY, DIM)(ids))
    assert embedding_tables(model)[0]["index_bytes"] == 8

    free_length = tf_keras.Input((None,), dtype="int32")
    model = tf_keras.Model(free_length, tf_keras.layers.Embedding(VOCABULARY, DIM)(free_length))
    tables = embedding_tables(model)
    assert tables[0]["lookups"] is None  # the sequence length is not known before fit
    assert gathered_bytes(tables, GLOBAL_BATCH, REPLICAS) is None


@pytest.mark.slow
def test_a_real_run_records_the_gathered_bytes_next_to_the_measured_gathers(
    tf, keras, strategy4, tmp_path
):
    import numpy as np

    with strategy4.scope():
        model = transformer_classifier(keras, tf)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, VOCABULARY, size=(GLOBAL_BATCH * 8, SEQUENCE)).astype("int32")
    labels = rng.integers(0, 2, size=(GLOBAL_BATCH * 8,))
    callbacks = kdt.callbacks(tmp_path, profile_start_step=3, monitor=False, advise=False)

    model.fit(tokens, labels, batch_size=GLOBAL_BATCH, verbose=0, callbacks=callbacks)

    rows = kdt.Report.load(tmp_path).steps
    gathered = rows[rows["gather_ms"] > 0]
    assert len(gathered) > 0  # the trace holds CollectiveGatherV2 ops
    assert (gathered["gather_bytes"] == EXPECTED_GATHER).all()
    assert gathered["gather_busbw_gbps"].notna().all()
    # The trace: per step and replica, 3 gathers (row counts, values, indices) for each of
    # the 2 sparse gradients, the positions' too, which the bytes count per replica.
    assert _gathers_in_traces(tmp_path) == PROFILED_STEPS * REPLICAS * 2 * 3


PROFILED_STEPS = 5  # DataParallelProfiler's default window


def _gathers_in_traces(log_dir) -> int:
    from keras_dp_tools.analysis.trace.xspace import host_planes, load_xspace, plane_events

    return sum(
        event.name.endswith(":CollectiveGatherV2")
        for trace in log_dir.glob("train/**/*.xplane.pb")
        for plane in host_planes(load_xspace(trace))
        for event in plane_events(plane)
    )
