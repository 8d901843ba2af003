"""One severity scale for lint, the run-time batching check and the advisor."""

import json

import pytest

from keras_dp_tools.checks.batching import Finding
from keras_dp_tools.checks.lint import CODES, SEVERITIES
from keras_dp_tools.common.findings import Advice
from keras_dp_tools.common.severity import Severity


def test_levels_compare_by_weight_not_alphabet():
    # As plain strings "error" < "info" < "warning": the scale must not sort that way.
    assert sorted([Severity.WARNING, Severity.ERROR, Severity.INFO]) == [
        Severity.INFO,
        Severity.WARNING,
        Severity.ERROR,
    ]
    assert Severity.ERROR > "warning" and Severity.INFO < Severity.WARNING


def test_members_are_the_plain_words():
    assert f"{Severity.ERROR}" == "error" and Severity.INFO == "info"
    assert json.dumps({"severity": Severity.WARNING}) == '{"severity": "warning"}'


def test_words_are_read_in_any_case_and_unknown_words_refused():
    assert Severity("Error") is Severity.ERROR and Severity("WARNING") is Severity.WARNING
    with pytest.raises(ValueError, match="received 'high'"):  # the 0.x word is gone
        Severity("high")
    with pytest.raises(ValueError, match="received 'severe'"):
        Severity("severe")


def test_batching_findings_advice_and_lint_share_the_scale():
    finding = Finding("error", "missing-multiply", "m", "f")
    advice = Advice("error", "t", "e", "f")
    assert finding.severity is advice.severity is Severity.ERROR
    assert str(advice).startswith("[error] t")
    assert set(SEVERITIES) == set(CODES)
    assert all(isinstance(level, Severity) for level in SEVERITIES.values())
    with pytest.raises(ValueError, match="received 'fatal'"):
        Finding("fatal", "x", "m", "f")
