"""Layer 6, tools: what a person runs: the ``keras-dp`` command, the demo, ``doctor``,
``launch``, sweeps and the tuning helpers. They put the layers below together.

May import: every layer.
"""
