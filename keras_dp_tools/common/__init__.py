"""Layer 0, common: dependency-free helpers every layer may use (lazy exports, warnings
that point at the user's code, argument checks, the severity scale).

May import: nothing of keras_dp_tools.
"""
