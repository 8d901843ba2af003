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


def test_learning_rate_rules():
    assert kdt.scale_learning_rate(0.1, 1024, 256) == pytest.approx(0.4)
    assert kdt.scale_learning_rate(1e-3, 1024, 256, rule="sqrt") == pytest.approx(2e-3)
    assert kdt.scale_learning_rate(1e-3, 1024, 256, rule="none") == 1e-3
    with pytest.raises(ValueError, match="rule must be one of linear, sqrt, none; received 'log'"):
        kdt.scale_learning_rate(0.1, 1024, 256, rule="log")
    with pytest.raises(ValueError, match=r"base_lr must be a positive number, received -0\.1"):
        kdt.scale_learning_rate(-0.1, 1024, 256)


def test_scaling_plan_explains_itself():
    plan = kdt.plan_scaling(
        8, 128, base_lr=0.1, base_batch=256, warmup_epochs=5, steps_per_epoch=100
    )

    assert (plan.global_batch, plan.target_lr, plan.warmup_steps) == (1024, pytest.approx(0.4), 500)
    assert "8 replicas x 128 examples = a global batch of 1024" in plan.explanation
    assert "linear rule" in plan.explanation and "first 500 steps" in plan.explanation
    assert plan.to_record()["plan_target_lr"] == pytest.approx(0.4)
    assert "| global_batch | 1024 |" in plan.to_markdown()
    sqrt = kdt.plan_scaling(4, 64, base_lr=1e-3, base_batch=64, rule="sqrt")
    assert sqrt.target_lr == pytest.approx(2e-3) and sqrt.warmup_steps == 0
    assert sqrt.schedule() == pytest.approx(2e-3)  # no warm-up: a constant


def test_warmup_epochs_need_steps_per_epoch():
    with pytest.raises(ValueError, match="needs steps_per_epoch"):
        kdt.plan_scaling(4, 64, base_lr=0.1, base_batch=256, warmup_epochs=5)


def test_docstring_examples_hold():
    import doctest

    import keras_dp_tools.setup.scaling

    result = doctest.testmod(keras_dp_tools.setup.scaling, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 5 and result.failed == 0
