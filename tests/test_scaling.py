"""scale_batch_size and replica_count. No TensorFlow."""

from types import SimpleNamespace

import pytest

import keras_dp_tools as kdt


def test_global_batch_is_per_replica_times_replicas():
    assert kdt.scale_batch_size(64, 4) == 256
    assert kdt.scale_batch_size(16, SimpleNamespace(num_replicas_in_sync=8)) == 128


def test_real_strategy(strategy4):
    assert kdt.scale_batch_size(16, strategy4) == 64


@pytest.mark.parametrize("per_replica", [0, -4, 2.5, True, "64"])
def test_bad_per_replica_batch_names_the_value(per_replica):
    with pytest.raises(ValueError, match="per_replica_batch must be a positive integer"):
        kdt.scale_batch_size(per_replica, 4)


def test_bad_replicas_name_what_was_received():
    with pytest.raises(TypeError, match="received 'four' of type str"):
        kdt.scale_batch_size(64, "four")
    with pytest.raises(
        ValueError, match="The replica count must be a positive integer, received 0"
    ):
        kdt.replica_count(0)
