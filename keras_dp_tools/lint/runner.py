"""Running the checks over files, folders and notebooks, with ``# noqa`` handling."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from keras_dp_tools.lint.checker import Violation, check_source

_NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:[,\s]+[A-Z]+[0-9]+)*))?", re.I)
# IPython syntax that is not Python: line magics, shell escapes, help.
_IPYTHON_LINE = re.compile(r"^\s*(?:[%!]|\?|\w[\w.]*\?\??\s*$)")


@dataclass(frozen=True)
class Report:
    """A violation at a place: ``location`` is ``line:col`` or ``cell_<n>:line:col``."""

    path: str
    location: str
    violation: Violation

    def __str__(self) -> str:
        return f"{self.path}:{self.location}: {self.violation.code} {self.violation.message}"


def suppressed(line: str, code: str) -> bool:
    """Whether ``line`` carries ``# noqa`` or ``# noqa: <code>[, ...]``."""
    match = _NOQA.search(line)
    if match is None:
        return False
    codes = match.group("codes")
    return codes is None or code.upper() in {c.upper() for c in re.split(r"[,\s]+", codes)}


def notebook_cells(path: Path) -> list[str]:
    """Sources of a notebook's code cells (IPython-only lines blanked, so line numbers
    stay). Raises ValueError if the file is not a notebook."""
    try:
        notebook = json.loads(path.read_text(encoding="utf-8"))
        cells = notebook["cells"]
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path} is not a Jupyter notebook ({error})") from None
    sources = []
    for cell in cells:
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else source
        if source.lstrip().startswith("%%"):  # a cell magic: the whole cell is not Python
            sources.append("\n" * source.count("\n"))
            continue
        lines = ["" if _IPYTHON_LINE.match(line) else line for line in source.split("\n")]
        sources.append("\n".join(lines))
    return sources


def _lint_python(path: Path) -> Iterator[Report]:
    source = path.read_text(encoding="utf-8", errors="replace")
    lines = source.splitlines()
    for violation in check_source(source, str(path)):
        line = lines[violation.line - 1] if 0 < violation.line <= len(lines) else ""
        if not suppressed(line, violation.code):
            yield Report(str(path), f"{violation.line}:{violation.col + 1}", violation)


def _lint_notebook(path: Path) -> Iterator[Report]:
    """Checks the code cells as one program (a strategy made in one cell reaches the
    others) and reports ``cell_<n>:line:col`` (cells counted from 1, code cells only)."""
    cells = notebook_cells(path)
    starts, joined = [], []
    line = 1
    for source in cells:
        starts.append(line)
        joined.append(source)
        line += source.count("\n") + 1
    program = "\n".join(joined)
    lines = program.splitlines()
    for violation in check_source(program, str(path)):
        cell = max(index for index, start in enumerate(starts) if start <= violation.line)
        text = lines[violation.line - 1] if 0 < violation.line <= len(lines) else ""
        if not suppressed(text, violation.code):
            where = f"cell_{cell + 1}:{violation.line - starts[cell] + 1}:{violation.col + 1}"
            yield Report(str(path), where, violation)


def python_files(paths: Iterable[str | os.PathLike]) -> Iterator[Path]:
    """``.py`` and ``.ipynb`` files: the paths themselves, or found under folders
    (hidden folders, virtual environments and checkpoints skipped)."""
    for given in paths:
        path = Path(given)
        if path.is_file():
            yield path
        elif path.is_dir():
            for found in sorted(path.rglob("*")):
                parts = found.relative_to(path).parts
                if any(part.startswith(".") or part in ("__pycache__", "venv") for part in parts):
                    continue
                if found.suffix in (".py", ".ipynb") and found.is_file():
                    yield found
        else:
            raise FileNotFoundError(f"No such file or directory: {path}")


def lint_paths(paths: Iterable[str | os.PathLike], ignore: Iterable[str] = ()) -> Iterator[Report]:
    """Violations in the files under ``paths``, in file order."""
    ignored = {code.upper() for code in ignore}
    for path in python_files(paths):
        reports = _lint_notebook(path) if path.suffix == ".ipynb" else _lint_python(path)
        for report in reports:
            if report.violation.code not in ignored:
                yield report
