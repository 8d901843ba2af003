"""Running the checks over files, folders and notebooks, with ``# noqa`` handling."""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from keras_dp_tools.checks.lint.checker import (
    Checker,
    Module,
    Related,
    Violation,
    check_source,
    syntax_violation,
)
from keras_dp_tools.checks.lint.notebook import blank_ipython_lines, code_cells
from keras_dp_tools.common.severity import Severity

_NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:[,\s]+[A-Z]+[0-9]+)*))?", re.I)


@dataclass(frozen=True)
class Report:
    """A violation at a place: ``line`` and 1-based ``col`` in the file, or in code cell
    ``cell`` (counted from 1) of a notebook; ``related`` the other places it involves, as
    dicts with ``path``, ``line``, ``col``, ``cell`` and ``message``."""

    path: str
    line: int
    col: int
    violation: Violation
    cell: int | None = None
    related: tuple[dict, ...] = ()

    # A finding's severity, code and message, as ``kdt.Advice`` and ``kdt.Finding`` have them.
    @property
    def severity(self) -> Severity:
        return self.violation.severity

    @property
    def code(self) -> str:
        return self.violation.code

    @property
    def message(self) -> str:
        return self.violation.message

    @property
    def location(self) -> str:
        """``line:col``, or ``cell_<n>:line:col`` in a notebook."""
        where = f"{self.line}:{self.col}"
        return f"cell_{self.cell}:{where}" if self.cell is not None else where

    def __str__(self) -> str:
        return f"{self.path}:{self.location}: {self.violation.code} {self.violation.message}"

    def to_dict(self) -> dict:
        """The finding as JSON-ready data (``keras-dp lint --format json``)."""
        return {
            "path": self.path,
            "line": self.line,
            "col": self.col,
            "cell": self.cell,
            "code": self.violation.code,
            "severity": str(self.violation.severity),
            "message": self.violation.message,
            "related": list(self.related),
        }


class Project:
    """The project files a lint run may follow imports into, parsed once each.

    A module name is looked up next to the importing file, under the folder above its
    top package (the folder without ``__init__.py``), and under ``roots`` (the folders
    given to ``keras-dp lint``); relative imports from the importing file's package.
    Installed packages are never read.
    """

    def __init__(self, roots: Iterable[str | os.PathLike] = ()):
        self.roots = [Path(root).resolve() for root in roots]
        self._modules: dict[Path, Module | None] = {}
        self._found: dict[tuple, Module | None] = {}

    def register(
        self, filename: str | os.PathLike, tree: ast.Module, lines: list[str] | None = None
    ) -> Module:
        """The module of a file being checked (its own tree and lines: a notebook's,
        flake8's; lines read from the file when not given)."""
        path = Path(filename).resolve()
        self._modules[path] = module = Module(tree, path, lines, self)
        return module

    def parsed(self, filename: str | os.PathLike) -> Module | None:
        """The module of a file already checked (registered), if any. A file read only as
        another file's import is not: its own imports were not followed then, and the
        same file must give the same findings whatever order the files are checked in."""
        module = self._modules.get(Path(filename).resolve())
        return module if module is not None and module.follows_imports else None

    def load(self, importer: Path, level: int, dotted: str) -> Module | None:
        """The module ``dotted`` as imported from file ``importer`` (``level`` dots)."""
        key = (importer, level, dotted)
        if key not in self._found:
            self._found[key] = self._find(importer, level, dotted)
        return self._found[key]

    def _find(self, importer: Path, level: int, dotted: str) -> Module | None:
        for base in self._bases(importer, level):
            target = base.joinpath(*dotted.split(".")) if dotted else base
            files = [target.parent / f"{target.name}.py"] if dotted else []
            for path in [*files, target / "__init__.py"]:
                if path.is_file():
                    return self._parse(path)
        return None

    def _bases(self, importer: Path, level: int) -> list[Path]:
        if level:
            return [importer.parents[level - 1]] if len(importer.parents) >= level else []
        top = importer.parent
        while (top / "__init__.py").is_file() and top.parent != top:
            top = top.parent
        return list(dict.fromkeys([importer.parent, top, *self.roots]))

    def _parse(self, path: Path) -> Module | None:
        path = path.resolve()
        if path not in self._modules:
            try:
                source = path.read_text(encoding="utf-8")
                tree = ast.parse(source, filename=str(path))
                self._modules[path] = Module(tree, path, source.splitlines())
            except (OSError, SyntaxError, UnicodeDecodeError, ValueError, RecursionError):
                self._modules[path] = None
        return self._modules[path]

    @staticmethod
    def display(path: Path) -> str:
        """``path`` relative to the working directory when under it, else absolute."""
        try:
            return str(path.relative_to(Path.cwd()))
        except ValueError:
            return str(path)


def suppressed(line: str, code: str) -> bool:
    """Whether ``line`` carries ``# noqa`` or ``# noqa: <code>[, ...]``."""
    match = _NOQA.search(line)
    if match is None:
        return False
    codes = match.group("codes")
    return codes is None or code.upper() in {c.upper() for c in re.split(r"[,\s]+", codes)}


def _related(related: Iterable[Related], path: str, locate) -> tuple[dict, ...]:
    found = []
    for place in related:
        cell, line = locate(place.line) if place.path is None else (None, place.line)
        found.append(
            {
                "path": path if place.path is None else place.path,
                "line": line,
                "col": place.col + 1,
                "cell": cell,
                "message": place.note,
            }
        )
    return tuple(found)


def _lint_python(path: Path, project: Project) -> Iterator[Report]:
    source = path.read_text(encoding="utf-8", errors="replace")
    lines = source.splitlines()
    module = project.parsed(path)  # read already, as another file's import?
    if module is not None:
        violations = Checker(module, project).violations()
    else:
        violations = check_source(source, str(path), project)
        python = blank_ipython_lines(source)  # a notebook exported with its magics
        if _unparsed(violations) and python != source:
            retry = check_source(python, str(path), project)
            violations = violations if _unparsed(retry) else retry
    for violation in violations:
        line = lines[violation.line - 1] if 0 < violation.line <= len(lines) else ""
        if not suppressed(line, violation.code):
            related = _related(violation.related, str(path), lambda line: (None, line))
            yield Report(str(path), violation.line, violation.col + 1, violation, None, related)


def _unparsed(violations: list[Violation]) -> bool:
    return any(violation.code == "KDP900" for violation in violations)


def _lint_notebook(path: Path, project: Project) -> Iterator[Report]:
    """Checks the code cells as one program (a strategy made in one cell reaches the
    others) and reports ``cell_<n>:line:col`` (cells counted from 1, code cells only). A
    cell that is not valid Python is one KDP900 and is left out; the others are checked.
    A ``%%writefile <name>.py`` cell is checked as a file of its own."""
    cells = code_cells(path)
    starts, joined, found = [], [], []
    line = 1
    for number, cell in enumerate(cells, 1):
        starts.append(line)
        python = cell.python
        try:
            ast.parse(python)
        except (SyntaxError, ValueError, RecursionError) as error:
            found.append((number, syntax_violation(error, "cell")))
            python = "\n" * python.count("\n")
        if cell.own_file:
            label = lambda line, n=number: f"cell_{n}:{line}"  # noqa: E731
            found += [(number, v) for v in check_source(python, str(path), None, label)]
            python = "\n" * python.count("\n")
        joined.append(python)
        line += python.count("\n") + 1
    program = "\n".join(joined)

    def locate(line: int) -> tuple[int, int]:
        cell = max(index for index, start in enumerate(starts) if start <= line)
        return cell + 1, line - starts[cell] + 1

    def label(line: int) -> str:
        cell, line = locate(line)
        return f"cell_{cell}:{line}"

    for violation in check_source(program, str(path), project, label):
        found.append((None, violation))
    for number, violation in found:
        if number is None:
            cell, line = locate(violation.line)
            related = _related(violation.related, str(path), locate)
        else:
            cell, line = number, violation.line
            related = _related(violation.related, str(path), lambda line, n=number: (n, line))
        source = cells[cell - 1].python.split("\n")
        text = source[line - 1] if 0 < line <= len(source) else ""
        if not suppressed(text, violation.code):
            yield Report(str(path), line, violation.col + 1, violation, cell, related)


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


@dataclass
class Summary:
    """What a lint run covered: files checked and findings reported (``line()`` is the
    one line ``keras-dp lint`` prints on stderr)."""

    files: int = 0
    findings: int = 0

    def line(self) -> str:
        files = "file" if self.files == 1 else "files"
        findings = "finding" if self.findings == 1 else "findings"
        return f"keras-dp lint: {self.files} {files} checked, {self.findings} {findings}"


def lint_paths(
    paths: Iterable[str | os.PathLike],
    ignore: Iterable[str] = (),
    project: Project | None = None,
    summary: Summary | None = None,
) -> Iterator[Report]:
    """Violations in the files under ``paths``, in file order. Imports between project
    files are followed (the folders in ``paths`` are searched for modules). A ``summary``
    given counts the files checked and the findings yielded.

    Example:
        >>> summary = Summary()
        >>> reports = list(lint_paths(["train.py"], summary=summary))  # doctest: +SKIP
        >>> print(summary.line())  # doctest: +SKIP
        keras-dp lint: 1 file checked, 0 findings
    """
    ignored = {code.upper() for code in ignore}
    paths = [Path(path) for path in paths]
    if project is None:
        project = Project(path for path in paths if path.is_dir())
    summary = summary if summary is not None else Summary()
    for path in python_files(paths):
        lint = _lint_notebook if path.suffix == ".ipynb" else _lint_python
        summary.files += 1
        for report in lint(path, project):
            if report.violation.code not in ignored:
                summary.findings += 1
                yield report
