"""The package's source read with ``ast``: its modules by name, what each imports, the
string constants in its code. Tests of the layers and of the contract's names use it."""

import ast
from pathlib import Path

import keras_dp_tools

PACKAGE = Path(keras_dp_tools.__file__).parent
# The package's own entry points: the public names (``kdt.*``) and ``python -m``.
ENTRY = ("keras_dp_tools", "keras_dp_tools.__main__")


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
