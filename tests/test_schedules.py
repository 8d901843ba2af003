"""warmup_schedule in Keras 3 and tf_keras: values, serialisation, training with it."""

import numpy as np
import pytest

import keras_dp_tools as kdt
from tests.helpers.training import dense_model, fit


def values(schedule, steps):
    return [float(schedule(step)) for step in steps]


@pytest.mark.parametrize("package", ["keras", "tf_keras"])
def test_linear_warmup_then_constant(tf, package):
    schedule = kdt.warmup_schedule(0.4, warmup_steps=10, start_lr=0.1, keras_package=package)
    assert values(schedule, [0, 5, 10, 1000]) == pytest.approx([0.1, 0.25, 0.4, 0.4])
    assert type(schedule).__mro__[2].__module__.startswith(package)


@pytest.mark.parametrize("package", ["keras", "tf_keras"])
def test_serialises_with_the_wrapped_schedule(tf, package, request):
    keras = request.getfixturevalue(package)
    after = keras.optimizers.schedules.CosineDecay(0.4, decay_steps=100)
    schedule = kdt.warmup_schedule(0.4, warmup_steps=10, after=after)
    assert type(schedule).__mro__[2].__module__.startswith(package)  # follows `after`

    config = keras.optimizers.schedules.serialize(schedule)
    restored = keras.optimizers.schedules.deserialize(config)

    steps = [0, 5, 10, 50, 100]
    assert values(restored, steps) == pytest.approx(values(schedule, steps))
    assert values(schedule, [50]) == pytest.approx(values(after, [50]))


def test_trains_with_the_scaled_plan(tmp_path, keras, strategy4):
    plan = kdt.plan_scaling(
        strategy4, 8, base_lr=0.01, base_batch=8, warmup_epochs=1, steps_per_epoch=7
    )
    model = dense_model(keras, strategy4)
    with strategy4.scope():
        model.optimizer.learning_rate = plan.schedule()
    fit(model, [])
    assert float(np.asarray(model.optimizer.learning_rate)) == pytest.approx(plan.target_lr)


def test_bad_warmup_arguments_name_the_value():
    with pytest.raises(ValueError, match="warmup_steps must be a positive integer, received 0"):
        kdt.warmup_schedule(0.1, 0)
    with pytest.raises(ValueError, match="keras_package must be 'keras' or 'tf_keras'"):
        kdt.warmup_schedule(0.1, 10, keras_package="jax")
