"""Layer 0, common: dependency-free helpers every layer may use (lazy exports, warnings
that point at the user's code, argument checks, the severity scale, the one finding
type).

May import: nothing of keras_dp_tools.
"""
