"""One finding type for every producer: the advisor, the run-time batching check, the lint
and the GPU utilization notes. Presenters (report text, HTML, dashboard, TensorBoard,
lint output, ``--format json``) read its fields; dependency-free, so any layer may import it.

``kdt.Finding`` is this class; ``kdt.Advice`` and ``kdt.LintViolation`` are the same type
(subclasses that only keep the argument order those names had), so every presenter reads
one set of fields and ``isinstance(x, kdt.Finding)`` holds for all of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from keras_dp_tools.common.severity import Severity


@dataclass(frozen=True)
class Finding:
    """A problem (or remark) with its severity and what to do.

    Args:
        severity: a ``Severity`` (``error``, ``warning``, ``info``; the advisor's former
            words ``high`` and ``medium`` are read as error and warning).
        code: a stable identifier (``missing-multiply``, ``KDP001``, ...).
        message: what is wrong, in a sentence (the advisor's title).
        fix: what to change; empty where the producer has none (the lint's message
            says it).
        evidence: the measured numbers behind it (the advisor's); empty for findings
            read off code or configuration.
        path, line, col: where it is, for findings about source code: 1-based ``line``,
            0-based ``col`` (as ``ast`` and flake8 count them); None elsewhere.
        related: the other places it involves (the lint's ``Related`` entries).
        explains_ms_per_step: how many ms of each training step the finding's cause
            costs, for ranking the advisor's findings by what acting on them gains;
            None where a producer does not measure it.

    Raises:
        ValueError: ``severity`` names no level of ``Severity``.

    Example:

    >>> from keras_dp_tools.common.findings import Finding
    >>> finding = Finding("warning", "slow-input", "Input takes 40% of the step.",
    ...                   fix="Add .prefetch() to the dataset.")
    >>> print(finding)
    Input takes 40% of the step. Fix: Add .prefetch() to the dataset.
    >>> finding.severity > "info", finding.to_dict()["severity"]
    (True, 'warning')
    """

    severity: Severity
    code: str
    message: str
    fix: str = ""
    evidence: str = ""
    path: str | None = None
    line: int | None = None
    col: int | None = None
    related: tuple = field(default=(), compare=False)
    explains_ms_per_step: float | None = None

    def __post_init__(self):
        object.__setattr__(self, "severity", Severity(self.severity))
        object.__setattr__(self, "related", tuple(self.related))

    @property
    def title(self) -> str:
        """The message, as the advisor names it (``Advice.title``)."""
        return self.message

    def __str__(self) -> str:
        # A finding with evidence (the advisor's) reads as a block; the others as one
        # line with their fix (the batching warning's text).
        if self.evidence:
            return (
                f"[{self.severity}] {self.message}\n  evidence: {self.evidence}\n  fix: {self.fix}"
            )
        return f"{self.message} Fix: {self.fix}" if self.fix else self.message

    def __lt__(self, other: Finding) -> bool:
        """Findings sort by place, then code and message (the lint's file order)."""
        if not isinstance(other, Finding):
            return NotImplemented
        return self._place_order() < other._place_order()

    def _place_order(self) -> tuple:
        return (self.path or "", self.line or 0, self.col or 0, self.code, self.message)

    def to_markdown(self) -> str:
        """One markdown list item (TensorBoard's Text tab, the HTML report)."""
        text = f"- **{self.severity}: {self.message}**."
        if self.evidence:
            text += f" {self.evidence}"
        return text + (f" *Fix:* {self.fix}" if self.fix else "")

    def format(self, path: str | None = None) -> str:
        """``path:line:col: CODE message``, flake8's form, with a 1-based column;
        ``path`` defaults to the finding's own."""
        return f"{path or self.path}:{self.line}:{(self.col or 0) + 1}: {self.code} {self.message}"

    def to_dict(self) -> dict:
        """The finding as JSON-ready data (severity as its word, the place where known)."""
        data = {
            "severity": str(self.severity),
            "code": self.code,
            "message": self.message,
            "evidence": self.evidence,
            "fix": self.fix,
        }
        if self.line is not None:
            data.update(path=self.path, line=self.line, col=self.col)
        if self.explains_ms_per_step is not None:
            data["explains_ms_per_step"] = self.explains_ms_per_step
        return data


class Advice(Finding):
    """An advisor finding (``kdt.Advice``): a ``Finding`` made from the advisor's words.

    Args:
        severity: a ``Severity`` or its word.
        title: what is wrong, in a sentence (the ``message``).
        evidence: the measured numbers behind it.
        fix: what to change.
        code: a stable identifier of the finding.
        **fields: other fields of ``Finding`` (so ``dataclasses.replace`` works on it).

    Example:

    >>> from keras_dp_tools.common.findings import Advice, Finding
    >>> advice = Advice("error", "Scaling is poor", "1.2x on 4 replicas.", "Grow the batch.",
    ...                 code="poor-scaling")
    >>> isinstance(advice, Finding), advice.message
    (True, 'Scaling is poor')
    """

    def __init__(self, severity, title="", evidence="", fix="", code="", **fields):
        fields.setdefault("message", title)
        super().__init__(severity, code, fix=fix, evidence=evidence, **fields)
