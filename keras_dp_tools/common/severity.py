"""One severity scale for every finding: lint (KDP codes), the run-time batching check and
the advisor. Dependency-free, so any layer may import it.

``error``: the run is wrong or badly slowed as written; ``warning``: probably a problem,
or a choice that may be deliberate; ``info``: worth knowing. Levels compare by weight
(``Severity.ERROR > Severity.WARNING``), and members are strings (``"error"``), so
records, JSON and f-strings carry the plain word.
"""

from __future__ import annotations

import enum

# The advisor's former words, still accepted on input.
_ALIASES = {"high": "error", "medium": "warning"}


class Severity(enum.StrEnum):
    """How much a finding matters: ``error`` > ``warning`` > ``info``.

    Members are strings (``"error"``) and compare by weight, not alphabetically.

    Raises:
        ValueError: a value that names no level (the message lists the levels).

    Example:

    >>> from keras_dp_tools.common.severity import Severity
    >>> Severity("warning") > Severity.INFO
    True
    >>> sorted(["info", "error", "warning"], key=lambda word: -Severity(word).level)
    ['error', 'warning', 'info']
    >>> f"[{Severity.ERROR}]"
    '[error]'
    """

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"

    @classmethod
    def _missing_(cls, value):
        if isinstance(value, str):
            word = _ALIASES.get(value.lower(), value.lower())
            for member in cls:
                if member.value == word:
                    return member
        raise ValueError(
            f"severity must be one of error, warning, info (or high, medium), received {value!r}"
        )

    @property
    def level(self) -> int:
        """2 for error, 1 for warning, 0 for info: sort with ``key=lambda s: -s.level``."""
        return {"error": 2, "warning": 1, "info": 0}[self.value]

    # str's own comparisons are alphabetical; the scale compares by weight.
    def __lt__(self, other):
        return self.level < Severity(other).level

    def __le__(self, other):
        return self.level <= Severity(other).level

    def __gt__(self, other):
        return self.level > Severity(other).level

    def __ge__(self, other):
        return self.level >= Severity(other).level

    __hash__ = str.__hash__
