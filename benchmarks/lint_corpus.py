"""Precision and recall of ``keras-dp lint`` on the hand-labelled corpus of third-party
files listed in docs/lint-corpus.md (their code is not in this repository).

    python benchmarks/lint_corpus.py <folder>
    python benchmarks/lint_corpus.py <folder> --section "Blind corpus: dev half"

``--section`` reads the manifest table under that heading of docs/lint-corpus.md (default
``Manifest``, the first corpus); ``--manifest`` another file (a file without that heading
is read whole).

``<folder>`` holds local copies as ``<owner>+<repo>/<path>``. Every listed file is linted
(imports followed inside its own copy); a report matches a label on the same line (a
notebook line is ``cell_<n>:<line>``). Reports on ``ok`` lines, and on lines not in the
manifest, are false; ``unsure`` lines count neither way. Not a CI test: CI has no copies.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

from keras_dp_tools.checks.lint import Project, lint_paths

MANIFEST = Path(__file__).resolve().parent.parent / "docs" / "lint-corpus.md"
COUNTED = {"KDP001", "KDP003"}  # batch-size findings (KDP002 is about learning rates)


def section_rows(text: str, section: str) -> list[str]:
    """The lines under the heading ``section`` (up to the next heading of its level or
    above); the whole text when no heading is ``section``."""
    lines = text.splitlines()
    for index, line in enumerate(lines):
        level = len(line) - len(line.lstrip("#"))
        if level and line[level:].strip() == section:
            rows = []
            for row in lines[index + 1 :]:
                deeper = len(row) - len(row.lstrip("#"))
                if deeper and deeper <= level and row[deeper:].startswith(" "):
                    break
                rows.append(row)
            return rows
    return lines


def read_manifest(
    path: Path, section: str = "Manifest"
) -> dict[tuple[str, str], dict[str, tuple[str, str]]]:
    """(repository, path) -> {line: (label, reason)} from the manifest table."""
    files: dict[tuple[str, str], dict[str, tuple[str, str]]] = defaultdict(dict)
    for row in section_rows(path.read_text(encoding="utf-8"), section):
        cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
        if len(cells) != 6 or cells[0] in ("repository", "---") or set(cells[0]) <= {"-"}:
            continue
        repository, _, file, line, label, reason = cells
        files[(repository, file)]
        if line != "-":
            files[(repository, file)][line] = (label, reason)
    return files


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="local copies as <owner>+<repo>/<path>")
    parser.add_argument("--manifest", type=Path, default=MANIFEST)
    parser.add_argument("--section", default="Manifest", help="the manifest's heading")
    parser.add_argument("--repository", help="only files of repositories whose name has this")
    parser.add_argument("--not-repository", help="only files of the other repositories")
    args = parser.parse_args(argv)
    caught = missed = true = false = skipped = unsure = 0
    for (repository, file), labels in sorted(read_manifest(args.manifest, args.section).items()):
        if args.repository and args.repository not in repository:
            continue
        if args.not_repository and args.not_repository in repository:
            continue
        root = args.folder / repository.replace("/", "+")
        path = root / file
        if not path.is_file():
            print(f"skipped (no local copy): {path}")
            skipped += 1
            continue
        reports = {}
        for report in lint_paths([path], project=Project([root, path.parent])):
            where = f"cell_{report.cell}:{report.line}" if report.cell else str(report.line)
            if report.code in COUNTED:
                reports[where] = report
            elif report.code == "KDP900":
                print(f"{repository}/{file}: not parsed: {report.message}")
        for where, report in sorted(reports.items()):
            label = labels.get(where, ("unlabelled", ""))[0]
            if label == "flag":
                true += 1
            elif label == "unsure":
                unsure += 1
            else:
                false += 1
                print(f"FALSE  {repository}/{file}:{where} [{label}] {report.message[:110]}")
        for where, (label, reason) in sorted(labels.items()):
            if label != "flag":
                continue
            if where in reports:
                caught += 1
            else:
                missed += 1
                print(f"MISSED {repository}/{file}:{where} ({reason})")
    reported = true + false
    precision = true / reported if reported else float("nan")
    recall = caught / (caught + missed) if caught + missed else float("nan")
    print(
        f"reports {reported} (true {true}, false {false}); flag lines caught {caught} of "
        f"{caught + missed}; precision {precision:.2f}, recall {recall:.2f}; "
        f"reports on unsure lines {unsure} (not counted); files skipped {skipped}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
