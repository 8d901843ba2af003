"""The public names: ``kdt.callbacks`` (the function) and the capture subpackage both
reachable, and every exported name resolves in a fresh interpreter."""

import subprocess
import sys
from pathlib import Path


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_callbacks_function_and_capture_package_do_not_shadow_each_other():
    out = _run(
        "import inspect, keras_dp_tools as kdt\n"
        "import keras_dp_tools.capture as cb\n"
        "from keras_dp_tools.capture.step_timer import StepTimer\n"
        "print(inspect.isfunction(kdt.callbacks), inspect.ismodule(cb),\n"
        "      cb.callbacks is kdt.callbacks, cb.StepTimer is StepTimer is kdt.StepTimer)"
    )
    assert out == "True True True True"


def test_no_module_is_named_like_the_callbacks_function():
    # No alias module: ``import keras_dp_tools.callbacks as cb`` looks the attribute up
    # first, so an alias would hand back the function again, as before the rename.
    # (Checked on disk: an editable install elsewhere may still map the old name.)
    import keras_dp_tools as kdt

    package = Path(kdt.__file__).parent
    assert not (package / "callbacks").exists() and not (package / "callbacks.py").exists()


def test_every_exported_name_resolves_without_importing_tensorflow():
    out = _run(
        "import sys, keras_dp_tools as kdt\n"
        "missing = [n for n in kdt.__all__ if getattr(kdt, n, None) is None]\n"
        "print(missing, 'tensorflow' in sys.modules)"
    )
    assert out == "[] False"


def test_users_reach_analysis_plots_findings_and_one_severity_scale():
    import keras_dp_tools as kdt
    from keras_dp_tools.analysis.breakdown.api import analyze_trace
    from keras_dp_tools.checks.lint.checker import SEVERITIES, Violation

    assert kdt.analyze_trace is analyze_trace
    assert kdt.plots.__name__ == "keras_dp_tools.report.plots"
    assert kdt.LintViolation is Violation
    # The three kinds of finding speak the same scale.
    advice = kdt.Advice("high", "t", "e", "f")
    finding = kdt.Finding("warning", "code", "message", "fix")
    assert isinstance(advice.severity, kdt.Severity) and advice.severity is kdt.Severity.ERROR
    assert isinstance(finding.severity, kdt.Severity)
    assert all(isinstance(level, kdt.Severity) for level in SEVERITIES.values())


def test_the_package_imports_no_developer_code():
    """dev/ (the GPU check), benchmarks/ (HookTimer) and tests/ (the consistency oracle)
    sit beside the package: a wheel has none of them, so no module of the package may
    import them, even inside a function."""
    import ast

    from tests.helpers.package_source import MODULES

    reached = {}
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                tops = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                tops = [node.module.split(".")[0]]
            else:
                continue
            for top in tops:
                if top in ("dev", "benchmarks", "tests"):
                    reached.setdefault(name, set()).add(top)
    assert reached == {}
    assert "keras_dp_tools.tools.doctor" in MODULES  # the walk sees the package
