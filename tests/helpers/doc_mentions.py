"""What README.md and docs/*.md name that the code must have: the ``keras-dp`` options
each passage attributes to a command, the dotted names of the package, the package's
files and the inline calls of ``kdt`` functions. Read from the pages' text, so that the
checks of tests/test_docs_claims.py test what a reader sees.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tests.helpers import REPO
from tests.helpers.doc_blocks import FENCE, documents


@dataclass(frozen=True)
class Passage:
    document: str
    line: int  # 1-based line of its first line
    text: str
    code: bool  # a line of a fenced block (else a paragraph or list item of prose)


def passages(document: str) -> list[Passage]:
    """The units a mention is read in: each line of a fenced block, and each paragraph
    or list item of prose (a list item ends at the next item or a blank line)."""
    lines = (REPO / document).read_text().splitlines()
    found: list[Passage] = []
    prose: list[str] = []
    start = 0

    def flush():
        if prose:
            found.append(Passage(document, start + 1, " ".join(prose), code=False))
            prose.clear()

    fence = None
    for index, line in enumerate(lines):
        opening = FENCE.match(line)
        if fence is not None:
            if line.strip() == fence:
                fence = None
            else:
                found.append(Passage(document, index + 1, line, code=True))
            continue
        if opening is not None:
            flush()
            fence = opening.group("fence")
            continue
        if not line.strip() or re.match(r"\s*([-*+]|\d+\.)\s", line) or line.startswith("#"):
            flush()
        if line.strip():
            if not prose:
                start = index
            prose.append(line.strip())
    flush()
    return found


def subcommands() -> dict:
    """Each ``keras-dp`` command's name and its argparse parser."""
    from keras_dp_tools.tools.cli import build_parser

    return next(action for action in build_parser()._actions if action.dest == "command").choices


def all_passages() -> list[Passage]:
    return [passage for document in documents() for passage in passages(document)]


# What ends a command's options in a passage: another program named, or a ``--`` after
# which the arguments are the script's.
_OTHER_PROGRAMS = (
    "tensorboard",
    "nvidia-smi",
    "pytest",
    "pip",
    "python",
    "python3",
    "make",
    "jupyter",
    "mkdocs",
    "git",
    "srun",
    "flake8",
    "ruff",
)
_TOKEN = re.compile(
    r"(?P<command>keras-dp\s+(?P<name>[a-z][a-z-]*))"
    r"|`(?P<bare>[a-z][a-z-]*) (?=--)"  # `report --html`: the command named alone
    r"|(?P<other>(?<![\w.-])(?:" + "|".join(map(re.escape, _OTHER_PROGRAMS)) + r")(?![\w-]))"
    r"|(?P<demo_args>DEMO_ARGS=)"  # make demo DEMO_ARGS="--steps 9": the demo's
    r"|(?P<script>(?<![\w-])--(?=\s|$|\]))"
    r"|(?P<option>(?<![\w-])--[a-z][a-z0-9-]*)"
)


def option_mentions(commands: set[str]) -> list[tuple[Passage, str, str]]:
    """(passage, command, option) for each ``--option`` a passage attributes to a
    ``keras-dp`` command: the last command it named before the option (``keras-dp
    report``, or `` `report --html` ``) when no other program or ``--`` came between."""
    mentions = []
    for passage in all_passages():
        current = None
        for match in _TOKEN.finditer(passage.text):
            if match.group("command"):
                current = match.group("name") if match.group("name") in commands else None
            elif match.group("bare"):  # another program's, e.g. `tensorboard --logdir`
                current = match.group("bare") if match.group("bare") in commands else None
            elif match.group("demo_args"):
                current = "demo" if "demo" in commands else None
            elif match.group("other") or match.group("script"):
                current = None
            elif current is not None:
                mentions.append((passage, current, match.group("option")))
    return mentions


DOTTED_NAME = re.compile(r"(?<![\w./])(?:kdt|keras_dp_tools)(?:\.[A-Za-z_]\w*)+")
_INLINE_CODE = re.compile(r"`([^`\n]+)`")


def code_texts() -> list[tuple[Passage, str]]:
    """Each passage's code: a fenced line whole, or each inline code span of prose."""
    texts = []
    for passage in all_passages():
        if passage.code:
            texts.append((passage, passage.text))
        else:
            texts += [(passage, span) for span in _INLINE_CODE.findall(passage.text)]
    return texts


def dotted_names() -> list[tuple[Passage, str]]:
    """``kdt.x.y`` and ``keras_dp_tools.x.y`` as the pages write them (in code)."""
    return [
        (passage, match.group(0).rstrip("."))
        for passage, code in code_texts()
        for match in DOTTED_NAME.finditer(code)
    ]


# A file of the package or the repository named in inline code: ``analysis/x.py``,
# ``x.py``, ``notebooks/regenerate.py``.
_PYTHON_FILE = re.compile(r"^[\w./-]*\w\.py$")


def python_file_mentions() -> list[tuple[Passage, str]]:
    return [
        (passage, span)
        for passage in all_passages()
        if not passage.code
        for span in _INLINE_CODE.findall(passage.text)
        if _PYTHON_FILE.match(span)
    ]


# An inline call of a public function or class: `kdt.name(...)`, one span.
_INLINE_CALL = re.compile(r"^kdt\.[\w.]+\(.*\)$")


def inline_calls() -> list[tuple[Passage, str]]:
    """Calls written as one inline code span (prose), e.g. ``kdt.what_if(report, ...)``;
    ``...`` as an argument stands for a value the reader supplies."""
    return [
        (passage, span)
        for passage in all_passages()
        if not passage.code
        for span in _INLINE_CODE.findall(passage.text)
        if _INLINE_CALL.match(span)
    ]
