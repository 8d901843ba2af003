"""The environment variables and the capture path are spelled in keras_dp_tools.records.contract
only: messages and help texts name them through its constants too, so a rename there
reaches every sentence (tests/test_layers.py checks the literals used as values)."""

import re

import pytest

from keras_dp_tools.records import contract
from tests.helpers.package_source import MODULES, string_constants

# Inside any code string (docstrings are documentation, not code).
SPELLED = re.compile(r"\bKERAS_DP_[A-Z_]+|plugins/profile|\.xplane\.pb")


def test_no_code_string_spells_a_contract_name():
    spelled = {
        name: sorted(text[:80] for text in string_constants(path) if SPELLED.search(text))
        for name, path in MODULES.items()
        if name != "keras_dp_tools.records.contract"
    }
    assert {name: texts for name, texts in spelled.items() if texts} == {}


def test_the_pattern_finds_what_the_contract_defines():
    # The test can fail: each name the contract defines matches the pattern.
    for value in (contract.REPLICAS_ENV, contract.LOG_DIR_ENV, contract.RUN_ID_ENV):
        assert SPELLED.search(f"set {value}=4")
    assert SPELLED.search(f"a{contract.TRACE_SUFFIX} file")
    assert SPELLED.search(contract.PROFILE_SUBDIR.as_posix())


def test_help_texts_name_the_variables_through_the_contract(capsys):
    from keras_dp_tools.tools.cli import build_parser

    for command in ("demo", "sweep", "launch"):
        with pytest.raises(SystemExit):
            build_parser().parse_args([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for value in (contract.REPLICAS_ENV, contract.LOG_DIR_ENV, contract.RUN_ID_ENV):
        assert value in text
