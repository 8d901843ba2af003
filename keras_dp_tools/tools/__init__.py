"""Layer 6, tools: what a person runs: the ``keras-dp`` command, the demo, ``doctor``,
``launch``, sweeps, the tuning helpers and the strategy comparison. They put the layers
below together.

May import: every layer.
"""
