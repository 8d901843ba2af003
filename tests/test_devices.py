"""configure_devices once TensorFlow runs with 4 logical CPU devices (see conftest)."""

import pytest

import keras_dp_tools as kdt


def test_fewer_replicas_than_configured_devices_use_the_first_ones(tf):
    assert kdt.configure_devices(2) == ["/cpu:0", "/cpu:1"]
    assert kdt.configure_devices(4) == [f"/cpu:{i}" for i in range(4)]


def test_more_devices_after_initialisation_explains_what_to_do(tf):
    with pytest.raises(RuntimeError, match=r"already initialised .* call it at the start"):
        kdt.configure_devices(8)


def test_replicas_come_from_the_environment(tf, monkeypatch):
    monkeypatch.setenv("KERAS_DP_REPLICAS", "3")
    assert kdt.configure_devices() == ["/cpu:0", "/cpu:1", "/cpu:2"]

    monkeypatch.setenv("KERAS_DP_REPLICAS", "three")
    with pytest.raises(
        ValueError, match="KERAS_DP_REPLICAS must be a positive integer, received 'three'"
    ):
        kdt.configure_devices()


@pytest.mark.parametrize("replicas", [0, -1, 1.5])
def test_bad_replicas_name_the_value(tf, replicas):
    with pytest.raises(
        ValueError, match=f"replicas must be a positive integer, received {replicas}"
    ):
        kdt.configure_devices(replicas)
