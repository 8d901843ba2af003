"""A notebook's code cells as Python: IPython-only syntax blanked, line numbers kept.

Blanked anywhere in a cell, also inside an indented block (``%tensorflow_version 2.x``
under ``try:``): line magics (``%pip install x``; the timing ones keep the statement they
run: ``%time model.fit(ds)`` is ``model.fit(ds)``), shell lines (``!pip install x``, with
their ``\\`` continuation lines), help (``?obj``, ``obj?``) and assignments from them
(``files = !ls``, kept as ``files = None``). A blanked line that would leave a block empty
becomes ``pass`` at its indentation. A cell magic (``%%writefile``, ``%%bash``) makes the
whole cell non-Python, except those that run the cell's Python (``%%time``,
``%%capture``) and ``%%writefile <name>.py``, whose Python is a file of its own (checked
apart from the notebook's program).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

# IPython syntax that is not Python: line magics, shell escapes, help.
_IPYTHON_LINE = re.compile(r"^(?P<indent>\s*)(?:[%!]|\?|\w[\w.]*\?\??\s*$)")
_IPYTHON_ASSIGNMENT = re.compile(r"^(?P<head>\s*[\w.]+\s*=\s*)[%!]")
PYTHON_CELL_MAGICS = {"time", "timeit", "capture", "prun", "debug"}
# Line magics that run the Python statement after them (``%time model.fit(ds)``), with
# the options that take a separate value (``%timeit -n 1 -r 1 step()``).
_TIMING_LINE = re.compile(
    r"^(?P<indent>\s*)(?P<head>[\w.]+\s*=\s*)?%(?:time|timeit|prun)"
    r"(?P<options>(?:\s+-(?:[nrpslTD]\s+\S+|\w+))*)\s+(?P<statement>\S.*)$"
)


@dataclass(frozen=True)
class Cell:
    """A code cell as Python (same line count): part of the notebook's ``program``, or
    (``own_file``) a ``%%writefile <name>.py`` cell, a module of its own."""

    python: str
    own_file: bool = False


def code_cells(path: Path) -> list[Cell]:
    """A notebook's code cells as Python. Raises ValueError if the file is not a notebook."""
    try:
        notebook = json.loads(path.read_text(encoding="utf-8"))
        cells = notebook["cells"]
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path} is not a Jupyter notebook ({error})") from None
    found = []
    for cell in cells:
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else source
        found.append(python_of_cell(source))
    return found


def notebook_cells(path: Path) -> list[str]:
    """Sources of a notebook's code cells as one program's parts (IPython-only lines
    blanked, so line numbers stay; ``%%writefile`` cells blank). Raises ValueError if the
    file is not a notebook."""
    return [
        "\n" * cell.python.count("\n") if cell.own_file else cell.python
        for cell in code_cells(path)
    ]


def python_of_cell(source: str) -> Cell:
    """The cell as Python, with the same number of lines."""
    stripped = source.lstrip()
    own_file = False
    if stripped.startswith("%%"):
        words = stripped[2:].split("\n", 1)[0].split()
        magic = words[0] if words else ""
        own_file = magic == "writefile" and words[-1].endswith(".py")
        if magic not in PYTHON_CELL_MAGICS and not own_file:  # the whole cell is not Python
            return Cell("\n" * source.count("\n"))
        lines = source.split("\n")
        first = next(index for index, line in enumerate(lines) if line.strip())
        lines[first] = ""
        source = "\n".join(lines)
    return Cell(blank_ipython_lines(source), own_file)


def blank_ipython_lines(source: str) -> str:
    """The cell with IPython-only lines blanked; a line inside open brackets (``%(a, b)``
    continuing an expression) is Python, not a magic."""
    lines, depth, continued = [], 0, False
    for line in source.split("\n"):
        if continued:  # the rest of a "!cmd \" shell line
            lines.append("")
            continued = line.rstrip().endswith("\\")
            continue
        if depth <= 0:
            assignment = _IPYTHON_ASSIGNMENT.match(line)
            magic = _IPYTHON_LINE.match(line)
            timed = _TIMING_LINE.match(line)
            if timed:  # the statement it times is the program's: kept, the magic dropped
                line = timed.group("indent") + (timed.group("head") or "")
                line += timed.group("statement")
            elif assignment or magic:
                continued = line.rstrip().endswith("\\")
                if assignment:
                    lines.append(assignment.group("head") + "None")
                else:
                    indent = magic.group("indent")
                    lines.append(f"{indent}pass" if indent else "")
                continue
        lines.append(line)
        code = re.sub(r"'[^']*'|\"[^\"]*\"|#.*", "", line)  # roughly: strings, comments
        depth += sum(code.count(c) for c in "([{") - sum(code.count(c) for c in ")]}")
    return "\n".join(lines)
