"""The layers, read from the source with ``ast`` so they cannot drift.

Each subpackage of keras_dp_tools is a layer, and its docstring says which layers it
may import (a line ``May import: ``a``, ``b``.``). These tests read those lines, so
a new module cannot sit outside a layer, and check every import against them (imports
inside functions too): no import runs from a lower layer to a higher one, and no two
modules import each other, directly or round a longer loop."""

import ast
import re

from tests.helpers.package_source import ENTRY, MODULES, PACKAGE, imports, string_constants

GRAPH = {name: imports(path) - {name} for name, path in MODULES.items()}


def within(name: str, prefixes) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


LAYER_LINE = re.compile(r"May import:(.*?)(?:\.\s*$|\n\n)", re.S | re.M)


def layer_of(name: str) -> str | None:
    parts = name.split(".")
    return None if name in ENTRY else parts[1]


def declared_layers() -> dict[str, set[str]]:
    """Layer -> the layers its docstring says it may import."""
    declared = {}
    for package in sorted(path.parent for path in PACKAGE.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
        match = LAYER_LINE.search(doc)
        assert match, f"{package.name}/__init__.py does not say what it may import"
        named = set(re.findall(r"``(\w+)``", match.group(1).split(", and of")[0]))
        declared[package.name] = named if "every layer" not in match.group(1) else {"*"}
    return declared


LAYERS = declared_layers()
# The one door from capture into the analysis: the runner analyses a finished window
# or run, so the callbacks hold no analysis themselves.
NARROW_DOORS = {("capture", "analysis"): {"keras_dp_tools.analysis.runner"}}


def test_every_module_sits_in_a_layer():
    outside = [name for name in MODULES if name not in ENTRY and layer_of(name) not in LAYERS]
    assert outside == []
    assert set(LAYERS) == {
        "common",
        "records",
        "analysis",
        "setup",
        "checks",
        "report",
        "capture",
        "tools",
    }


def test_the_declared_layers_are_ordered():
    # A layer that may import another, which may import it back, is no layer.
    def below(layer, seen=()):
        for lower in LAYERS[layer] - {"*"}:
            assert lower not in seen, f"layers loop: {[*seen, layer, lower]}"
            yield lower
            yield from below(lower, (*seen, layer))

    for layer in LAYERS:
        assert layer not in set(below(layer))


def test_the_graph_is_read():
    # The test can fail: these imports exist.
    assert "keras_dp_tools.records.contract" in GRAPH["keras_dp_tools.capture.recorder"]
    assert "keras_dp_tools.analysis.summary" in GRAPH["keras_dp_tools.report.facade"]
    assert "keras_dp_tools.analysis.advice" in GRAPH["keras_dp_tools.analysis.summary"]
    assert len(GRAPH) > 60


def test_imports_follow_the_layers():
    wrong = {}
    for name, targets in GRAPH.items():
        layer = layer_of(name)
        if layer is None or "*" in LAYERS[layer]:
            continue
        for target in targets:
            other = layer_of(target)
            if other is None or other == layer:
                continue
            door = NARROW_DOORS.get((layer, other))
            allowed = other in LAYERS[layer] or (door is not None and target in door)
            if not allowed:
                wrong.setdefault(name, []).append(target)
    assert wrong == {}


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


# The contract's literals, which only keras_dp_tools.records.contract may spell out.
CONTRACT_LITERALS = {"train", "kdp", "plugins", ".xplane.pb"}


def test_step_marker_capture_path_and_environment_are_spelled_once():
    spelled = {
        name: sorted(
            text
            for text in string_constants(path)
            if text in CONTRACT_LITERALS or text.startswith("KERAS_DP_")
        )
        for name, path in MODULES.items()
        if name != "keras_dp_tools.records.contract"
    }
    assert {name: texts for name, texts in spelled.items() if texts} == {}


def test_views_of_records_import_nothing_from_capture():
    # The report, plots and TensorBoard tab read records: they must work where nothing
    # was trained (no TensorFlow, no NVML).
    wrong = sorted(
        (name, target)
        for name, targets in GRAPH.items()
        if layer_of(name) == "report"
        for target in targets
        if layer_of(target) == "capture"
    )
    assert wrong == []


def test_no_private_name_of_another_module_is_used():
    # A name another module needs is part of its module's interface: public, or moved.
    # Both spellings count: ``from x import _y`` and ``x._y`` on a module imported as x.
    found = []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        modules = {}  # local name -> another module of ours it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "keras_dp_tools"
            ):
                found += [
                    f"{name}: {node.module}.{alias.name}"
                    for alias in node.names
                    if alias.name.startswith("_") and not alias.name.startswith("__")
                ]
                for alias in node.names:
                    if f"{node.module}.{alias.name}" in MODULES:
                        modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif isinstance(node, ast.Import):
                modules.update({alias.asname: alias.name for alias in node.names if alias.asname})
        modules = {local: module for local, module in modules.items() if module != name}
        found += [
            f"{name}: {modules[node.value.id]}.{node.attr}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ]
    assert found == []


def test_no_layer_reaches_around_the_layers_through_the_package_root():
    # ``from keras_dp_tools import Report`` inside a lower layer would pull the report in
    # through the public names; only the version may come from the root. Relative
    # imports are not read by these tests, so there must be none.
    found = []
    for name, path in MODULES.items():
        if name in ENTRY:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                found.append(f"{name}: relative import")
            elif isinstance(node, ast.ImportFrom) and node.module == "keras_dp_tools":
                found += [
                    f"{name}: keras_dp_tools.{alias.name}"
                    for alias in node.names
                    if alias.name != "__version__" and f"keras_dp_tools.{alias.name}" not in MODULES
                ]
    assert found == []


def test_no_test_module_imports_another():
    """Shared test code lives in tests/helpers: a test module importing another runs its
    fixtures' side effects twice and ties two files' edits together. Imports inside
    functions count too."""
    import ast
    from pathlib import Path

    tests = Path(__file__).resolve().parent
    found = []
    for path in sorted(tests.glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            found += [
                f"{path.name}:{node.lineno} imports {name}"
                for name in names
                if name.startswith("tests.test_")
            ]
    assert not found, found


def test_docs_architecture_names_every_module():
    """docs/architecture.md's "Every module" table lists each module of the package, so
    a newcomer finds where a change belongs (and a new module is placed there)."""
    from tests.helpers import REPO

    page = (REPO / "docs" / "architecture.md").read_text()
    named = set(re.findall(r"^\| `([\w/]+\.py)` \|", page, re.M))
    modules = {
        str(path.relative_to(REPO / "keras_dp_tools"))
        for path in (REPO / "keras_dp_tools").rglob("*.py")
        if path.name != "__init__.py"
    }
    assert not modules - named, f"add to docs/architecture.md: {sorted(modules - named)}"
    assert not named - modules, f"no such module: {sorted(named - modules)}"
