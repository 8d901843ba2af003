"""Versions of the stack known to train wrongly under a strategy, and what to say.

Both the capture (a warning when ``fit`` starts) and the advisor (an error, from the
trace's evidence) read these. Standard library only, so every layer may import it.
"""

from __future__ import annotations

import re

# Keras 3 before 3.5 applies each replica's own gradients under MirroredStrategy: no
# all-reduce runs and the replicas' weights drift apart (keras-team/keras#19308).
KERAS_ALLREDUCE_FIXED = (3, 5)
ALLREDUCE_BUG = (
    "Keras {version} does not all-reduce the gradients under {strategy} "
    "(keras-team/keras#19308, fixed in Keras 3.5): each of the {replicas} replicas applies "
    "its own gradients, so they train apart and the step's numbers measure that"
)
ALLREDUCE_FIX = "Upgrade Keras: pip install 'keras>=3.11' (what keras_dp_tools requires)."


def drops_gradient_allreduce(keras_package: str | None, keras_version: str | None) -> bool:
    """Whether ``keras_package`` (``"keras"`` or ``"tf_keras"``) at ``keras_version`` is a
    Keras 3 known not to all-reduce gradients under MirroredStrategy.

    Args:
        keras_package: ``"keras"`` or ``"tf_keras"`` (None: unknown).
        keras_version: its version string (None: unknown).

    Returns:
        True for Keras 3 before the fix (3.5); False otherwise or when unknown.

    Example:

    ```python
    from keras_dp_tools.common.known_bugs import drops_gradient_allreduce

    drops_gradient_allreduce("keras", "3.4.1")  # True
    drops_gradient_allreduce("tf_keras", "2.17.0")  # False: the legacy Keras is fine
    ```
    """
    if keras_package != "keras" or not keras_version:
        return False
    numbers = re.match(r"(\d+)\.(\d+)", keras_version)
    return bool(numbers) and (3, 0) <= tuple(map(int, numbers.groups())) < KERAS_ALLREDUCE_FIXED
