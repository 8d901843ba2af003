"""The fenced code blocks of README.md and docs/*.md, and which of them tests run.

A block is *run* when a test reads it with ``python_block(document, heading)`` (literal
strings, so that this module finds the call by reading the tests' source), or *marked*
when the nearest non-blank line before its fence is ``<!-- not run: REASON -->``.
tests/test_docs_examples.py fails on a block that is neither.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

from tests.helpers import REPO

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
NOT_RUN = re.compile(r"^\s*<!--\s*not run:\s*(?P<reason>\S.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    document: str  # relative to REPO, e.g. "docs/report.md"
    line: int  # 1-based line of the opening fence
    language: str  # the info string's first word, "" for none
    code: str  # the block's text without the indent of a list item
    not_run_reason: str | None  # the marker's reason, None when unmarked

    def __str__(self) -> str:
        return f"{self.document}:{self.line} ```{self.language}"


def fenced_blocks(document: str, text: str | None = None) -> list[Block]:
    """Every fenced block of ``document`` (a path under REPO; ``text`` replaces the
    file's content, for tests of this reader), in order."""
    lines = (REPO / document).read_text().splitlines() if text is None else text.splitlines()
    blocks = []
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        fence = opening.group("fence")
        end = index + 1
        while end < len(lines) and lines[end].strip() != fence:
            end += 1
        previous = next((line for line in reversed(lines[:index]) if line.strip()), "")
        marker = NOT_RUN.match(previous)
        blocks.append(
            Block(
                document=document,
                line=index + 1,
                language=(opening.group("info").split() or [""])[0],
                code=textwrap.dedent("\n".join(lines[index + 1 : end]) + "\n"),
                not_run_reason=marker.group("reason") if marker else None,
            )
        )
        index = end + 1
    return blocks


def documents() -> list[str]:
    """README.md and every page under docs/ (what the docs site builds)."""
    pages = sorted(str(path.relative_to(REPO)) for path in (REPO / "docs").rglob("*.md"))
    return ["README.md", *pages]


def find_python_block(document: str, heading: str) -> Block:
    """The first ```python block after the first line that contains ``heading``."""
    text = (REPO / document).read_text()
    assert heading in text, f"{heading!r} is not in {document}"
    heading_line = text[: text.index(heading)].count("\n") + 1
    for block in fenced_blocks(document):
        if block.line > heading_line and block.language == "python":
            return block
    raise AssertionError(f"no python block after {heading!r} in {document}")


def python_block(document: str, heading: str) -> str:
    """The code of the first ```python block after ``heading`` in ``document`` (under
    REPO): tests run what the docs say, as the docs say it."""
    return find_python_block(document, heading).code


def blocks_run_by_tests(test_files: list[Path] | None = None) -> dict[tuple[str, int], str]:
    """(document, line) of each block a test reads with ``python_block("doc", "heading")``,
    to the test file that reads it."""
    paths = test_files if test_files is not None else sorted((REPO / "tests").rglob("*.py"))
    run = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", getattr(node.func, "attr", None)) == "python_block"
                and len(node.args) == 2
                and all(isinstance(arg, ast.Constant) for arg in node.args)
            ):
                continue
            block = find_python_block(node.args[0].value, node.args[1].value)
            run[(block.document, block.line)] = path.name
    return run


def run_example(code: str, cwd: Path) -> str:
    """Runs a docs example in a fresh interpreter in ``cwd`` (this checkout's package
    first on the path); fails with its stderr unless it exits 0. Returns its stdout."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout
