"""The ``>>>`` examples in the package's docstrings run as written and print what they
say (doctest). None of these modules imports TensorFlow, so this needs no lock."""

import doctest
import importlib

import pytest

MODULES = [
    "keras_dp_tools.capture.data_parallel_profiler",
    "keras_dp_tools.capture.gpu_monitor",
    "keras_dp_tools.capture.job_identity",
    "keras_dp_tools.capture.monitor.host_usage",
    "keras_dp_tools.capture.monitor.nvml_reader",
    "keras_dp_tools.capture.monitor.replay",
    "keras_dp_tools.capture.run_info",
    "keras_dp_tools.checks.literal_batch",
    "keras_dp_tools.common.findings",
    "keras_dp_tools.common.severity",
    "keras_dp_tools.common.text",
    "keras_dp_tools.common.validation",
    "keras_dp_tools.records.comparison",
    "keras_dp_tools.records.contract",
    "keras_dp_tools.records.facts",
    "keras_dp_tools.records.reader",
    "keras_dp_tools.records.writer",
    "keras_dp_tools.report.export",
    "keras_dp_tools.report.step_lines",
    "keras_dp_tools.report.summary_fields",
    "keras_dp_tools.report.worker_plots",
    "keras_dp_tools.tools.doctor",
    "keras_dp_tools.tools.launch",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    flags = doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS
    result = doctest.testmod(module, optionflags=flags, report=True)
    assert result.attempted > 0, f"{name} has no >>> example"
    assert result.failed == 0
