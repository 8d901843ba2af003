"""Does ``fit`` train data-parallel at all? One replica while more devices are visible.

A model built and compiled outside ``strategy.scope()`` trains on the default strategy:
one replica, variables that are not mirrored, every other device idle. A strategy built
over one device (``MirroredStrategy(devices=["/gpu:0"])``) does the same. No batch size
fixes either, so the batching check proposes none then (``BatchScalingCheck``).

The facts are read from the model before the first step (``read_parallelism``); the
verdict is a pure function of them (``data_parallelism_findings``).
"""

from __future__ import annotations

from dataclasses import dataclass

from keras_dp_tools.common.findings import Finding

NO_DATA_PARALLELISM = "no-data-parallelism"


@dataclass(frozen=True)
class ParallelismFacts:
    """What decides whether a model trains data-parallel.

    Args:
        strategy: the class name of the model's ``distribute_strategy``.
        default_strategy: True for TensorFlow's default strategy (no ``scope()`` was
            entered when the model was built).
        replicas: the strategy's ``num_replicas_in_sync``.
        mirrored: whether the model's variables are distributed (mirrored) values;
            None when the model has no variables yet (a subclassed model built by its
            first step).
        devices: the devices visible to TensorFlow that a replica could run on: the
            logical GPUs, else the logical CPUs (more than one when the CPU is split).
        device_kind: ``"GPU"`` or ``"CPU"``: the kind counted in ``devices``.
    """

    strategy: str
    default_strategy: bool
    replicas: int
    mirrored: bool | None
    devices: int
    device_kind: str


def read_parallelism(model) -> ParallelismFacts:
    """The ``ParallelismFacts`` of a Keras 3 or tf_keras model, read before its first
    step (no data, no step run).

    Example:

    ```python
    import keras
    import keras_dp_tools as kdt
    from keras_dp_tools.checks.data_parallelism import read_parallelism

    kdt.configure_devices(2)  # before TensorFlow starts
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])  # no scope
    print(read_parallelism(model).replicas)  # 1, with 2 CPU devices visible
    ```

    Args:
        model: the model ``fit`` trains.

    Returns:
        A ``ParallelismFacts``.
    """
    import tensorflow as tf

    strategy = model.distribute_strategy
    gpus = tf.config.list_logical_devices("GPU")
    devices = gpus or tf.config.list_logical_devices("CPU")
    return ParallelismFacts(
        strategy=type(strategy).__name__,
        default_strategy="DefaultDistributionStrategy" in type(strategy).__name__,
        replicas=int(strategy.num_replicas_in_sync),
        mirrored=_variables_mirrored(model.weights),
        devices=len(devices),
        device_kind="GPU" if gpus else "CPU",
    )


def _variables_mirrored(variables) -> bool | None:
    """Whether the variables are distributed values: tf_keras's variables are, Keras 3's
    hold one in ``.value`` (a property there, a method in tf_keras)."""
    import tensorflow as tf

    if not variables:
        return None
    for variable in variables:
        held = getattr(variable, "value", None)
        candidates = (variable,) if callable(held) or held is None else (variable, held)
        if not any(isinstance(item, tf.distribute.DistributedValues) for item in candidates):
            return False
    return True


def data_parallelism_findings(facts: ParallelismFacts) -> list[Finding]:
    """The ``no-data-parallelism`` error when ``fit`` trains one replica while more
    devices are visible; nothing otherwise (one device, or several replicas).

    The message names each cause the facts show: the default strategy (the model was
    built outside any ``strategy.scope()``), variables that are not mirrored, one
    replica while N devices are visible.

    Example:

    ```python
    from keras_dp_tools.checks.data_parallelism import (
        ParallelismFacts, data_parallelism_findings)

    facts = ParallelismFacts("_DefaultDistributionStrategy", True, 1, False, 4, "GPU")
    print(data_parallelism_findings(facts)[0].fix)  # build and compile ... scope()
    ```

    Args:
        facts: what ``read_parallelism`` read.

    Returns:
        A list with the error, or an empty list.
    """
    if facts.replicas > 1 or facts.devices < 2:
        return []
    idle = (
        f"fit trains 1 replica while {facts.devices} {facts.device_kind} devices are "
        f"visible: {facts.devices - 1} of them stay idle and no gradient is all-reduced."
    )
    causes = []
    if facts.default_strategy:
        causes.append(
            "the model runs on TensorFlow's default strategy: it was built and compiled "
            "outside any strategy.scope()"
        )
    else:
        causes.append(
            f"the model's {facts.strategy} has one replica (it was built over one device)"
        )
    if facts.mirrored is False:
        causes.append("its variables are not mirrored")
    fix = (
        "Build and compile the model under `with strategy.scope():` (strategy = "
        "tf.distribute.MirroredStrategy(), over all devices), then call fit."
    )
    if not facts.default_strategy:
        fix = (
            "Build the strategy over all devices (tf.distribute.MirroredStrategy() with no "
            "devices argument), and build and compile the model under `with "
            "strategy.scope():`. If this one-device run is a deliberate baseline, ignore this."
        )
    return [
        Finding(
            "error",
            NO_DATA_PARALLELISM,
            f"No data parallelism: {idle} Cause: {'; '.join(causes)}. A batch-size change "
            "cannot fix this, so none is proposed.",
            fix,
        )
    ]
