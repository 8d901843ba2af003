"""Presentation layer: the "Data parallel" TensorBoard dashboard (``DataParallelPlugin``).

Installed with keras_dp_tools and found by TensorBoard through the ``tensorboard_plugins``
entry point; see ``docs/dashboard.md``.
"""
