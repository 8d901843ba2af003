"""The layers, read from the source with ``ast`` so they cannot drift: analysis imports
nothing from capture or presentation, and no two modules import each other (directly
or round a longer loop), counting imports inside functions too."""

import ast
from pathlib import Path

import keras_dp_tools

PACKAGE = Path(keras_dp_tools.__file__).parent
# Presentation: frames, plots, pages and TensorBoard. Capture: callbacks and samplers.
CAPTURE = ("keras_dp_tools.capture", "keras_dp_tools.monitor", "keras_dp_tools.devices")
PRESENTATION = (
    "keras_dp_tools.report",
    "keras_dp_tools.plots",
    "keras_dp_tools.html_report",
    "keras_dp_tools.tensorboard_plugin",
    "keras_dp_tools.cli",
    "keras_dp_tools.demo",
    "keras_dp_tools.sweep",
)
# Dependency-free modules every layer may use.
BASE = (
    "keras_dp_tools.contract",
    "keras_dp_tools.schema",
    "keras_dp_tools.severity",
    "keras_dp_tools.validation",
)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Modules of ours that ``path`` imports, anywhere in it (docstrings are not code)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # ``from pkg import name`` may name a submodule: count it if it is one.
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in MODULES else node.module)
    return {name for name in found if name.split(".")[0] == "keras_dp_tools"}


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}
GRAPH = {name: imports(path) - {name} for name, path in MODULES.items()}


def within(name: str, prefixes) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


def test_the_graph_is_read():
    # The test can fail: the capture layer does import the analysis.
    assert "keras_dp_tools.analysis" in GRAPH["keras_dp_tools.capture.data_parallel_profiler"]
    assert len(GRAPH) > 40


def test_analysis_imports_nothing_from_capture_or_presentation():
    wrong = {
        name: sorted(target for target in targets if within(target, CAPTURE + PRESENTATION))
        for name, targets in GRAPH.items()
        if within(name, ("keras_dp_tools.analysis",))
    }
    assert {name: targets for name, targets in wrong.items() if targets} == {}


def test_base_modules_import_nothing_of_ours():
    assert {name: sorted(GRAPH[name]) for name in BASE if GRAPH[name]} == {}


def test_no_import_cycles_between_modules():
    # A package's __init__ that lists its submodules' names is not a cycle with them.
    def edges(name):
        return [
            target
            for target in GRAPH[name]
            if target in GRAPH and not name.startswith(target + ".")
        ]

    cycles, state = [], {}

    def visit(name, path):
        state[name] = "open"
        for target in edges(name):
            if state.get(target) == "open":
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target])
        state[name] = "done"

    for name in sorted(GRAPH):
        if name not in state:
            visit(name, [name])
    assert cycles == []


# The contract's literals, which only keras_dp_tools.contract may spell out.
CONTRACT_LITERALS = {"train", "kdp", "plugins", ".xplane.pb"}


def string_constants(path: Path) -> set[str]:
    """String constants in code, not docstrings (f-string parts included)."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
    }


def test_step_marker_capture_path_and_environment_are_spelled_once():
    spelled = {
        name: sorted(
            text
            for text in string_constants(path)
            if text in CONTRACT_LITERALS or text.startswith("KERAS_DP_")
        )
        for name, path in MODULES.items()
        if name != "keras_dp_tools.contract"
    }
    assert {name: texts for name, texts in spelled.items() if texts} == {}


def test_views_of_records_import_nothing_from_capture():
    # The report, plots and TensorBoard tab read records: they must work where nothing
    # was trained (no TensorFlow, no NVML).
    views = ("keras_dp_tools.report", "keras_dp_tools.plots", "keras_dp_tools.html_report")
    views += ("keras_dp_tools.tensorboard_plugin",)
    wrong = {
        name: sorted(target for target in targets if within(target, CAPTURE))
        for name, targets in GRAPH.items()
        if within(name, views)
    }
    assert {name: targets for name, targets in wrong.items() if targets} == {}
