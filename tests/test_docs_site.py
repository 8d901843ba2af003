"""The docs site builds with ``mkdocs build --strict`` (a broken link, a missing page or a
docstring mkdocstrings cannot read fails it), its API reference covers every public
name, and what README.md and the docs say about versions agrees with the files that set
them. CI runs only ``make test``, so the strict build is checked here (a few seconds)."""

import configparser
import importlib
import os
import re
import subprocess
import sys
import tomllib

import pytest

import keras_dp_tools as kdt
from tests.helpers import REPO


def test_the_site_builds_strict_with_an_entry_per_public_name(tmp_path):
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )

    assert done.returncode == 0, done.stderr[-5000:]
    api = (site / "api" / "index.html").read_text()
    for identifier in api_entries().values():
        assert f'id="{identifier}"' in api, f"{identifier} has no entry in the built API page"
    changelog = (site / "changelog" / "index.html").read_text()
    assert "[Unreleased]" in changelog or "Unreleased" in changelog  # CHANGELOG.md itself


def api_entries() -> dict:
    """``::: module.name`` lines of docs/api.md, by the object they name."""
    entries = {}
    for identifier in re.findall(r"^::: (\S+)$", (REPO / "docs" / "api.md").read_text(), re.M):
        try:
            target = importlib.import_module(identifier)
        except ModuleNotFoundError:
            module, _, name = identifier.rpartition(".")
            target = getattr(importlib.import_module(module), name)
        entries[id(target)] = identifier
    return entries


def test_every_public_name_has_an_api_entry():
    entries = api_entries()
    names = [name for name in kdt.__all__ if name != "__version__"]

    missing = [name for name in names if id(getattr(kdt, name)) not in entries]
    assert not missing, f"docs/api.md has no ::: entry for kdt.{', kdt.'.join(missing)}"
    assert len(entries) == len(names)  # and none for a name that is not public


def _pins(name: str) -> dict[str, str]:
    return dict(
        line.split("==")
        for line in (REPO / name).read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )


def test_tested_versions_table_is_the_two_constraint_files():
    oldest, newest = _pins("constraints-oldest.txt"), _pins("constraints.txt")
    page = (REPO / "docs" / "getting-started.md").read_text()
    table = page[page.index("### Tested versions") :].split("\n## ")[0]
    rows = re.findall(r"^\| [^|]*?\(`([\w-]+)`[^|]*\) \| ([\w.]+) \| ([\w.]+) \|$", table, re.M)

    assert rows, "no (`package`) | oldest | newest rows under Tested versions"
    for package, low, high in rows:
        assert oldest.get(package) == low, f"{package}: {low}, oldest pin {oldest.get(package)}"
        assert newest.get(package) == high, f"{package}: {high}, pinned {newest.get(package)}"
    assert {"tensorflow", "keras", "tf-keras"} <= {row[0] for row in rows}
    assert re.search(r"^\| Python \| 3\.11 \| 3\.11 \|$", table, re.M)


def test_every_floor_setup_cfg_admits_is_the_oldest_stack_tested():
    """A bound in setup.cfg is true only if the oldest version it admits is the one
    `make test-oldest` installs: a floor lowered without testing it fails here."""
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    requires = setup["options"]["install_requires"].split()
    requires += setup["options.extras_require"]["multiworker"].split()
    floors = dict(re.fullmatch(r"([\w-]+)>=([\w.]+)", line).groups() for line in requires)
    oldest = _pins("constraints-oldest.txt")

    assert floors.keys() <= oldest.keys(), floors.keys() - oldest.keys()
    for package, floor in floors.items():
        pinned = tuple(int(part) for part in oldest[package].split("."))
        assert pinned[: len(floor.split("."))] == tuple(int(p) for p in floor.split(".")), (
            f"{package}>={floor} in setup.cfg, but constraints-oldest.txt tests {oldest[package]}"
        )
    assert {"tensorflow", "keras", "numpy", "pyarrow"} <= floors.keys()


def test_python_3_11_or_newer_everywhere():
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    ruff = tomllib.loads((REPO / "ruff.toml").read_text())

    assert setup["options"]["python_requires"] == ">=3.11"
    assert ruff["target-version"] == "py311"
    assert "Python 3.11 or newer" in (REPO / "README.md").read_text()
    assert "Python 3.11 or newer" in (REPO / "docs" / "getting-started.md").read_text()


def test_readme_is_short_and_its_links_resolve():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 150

    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # a URL
        path, _, anchor = target.partition("#")
        assert (REPO / path).exists(), f"README links to {target}: no such file"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", (REPO / path).read_text(), re.M)
            slugs = {re.sub(r"[^\w -]", "", h).strip().lower().replace(" ", "-") for h in headings}
            assert anchor in slugs, f"README links to {target}: no such heading"


@pytest.mark.parametrize("command", ["make demo", "make test", "make docs"])
def test_readme_make_targets_exist(command):
    target = command.split()[1]
    assert re.search(rf"^{target}:", (REPO / "Makefile").read_text(), re.M)
    assert command in (REPO / "README.md").read_text()


def test_the_changelog_has_release_sections_and_the_newest_is_the_version():
    """Keep a Changelog: [Unreleased] first, then releases newest first, each dated, with
    only the standard subsections; the newest release is the package's version."""
    text = (REPO / "CHANGELOG.md").read_text()
    releases = re.findall(r"^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$", text, re.M)
    subsections = set(re.findall(r"^### (.+)$", text, re.M))

    assert releases[0] == ("Unreleased", "")
    versions = [tuple(int(part) for part in version.split(".")) for version, _ in releases[1:]]
    assert versions and versions == sorted(versions, reverse=True), releases
    assert all(date for _, date in releases[1:]), "every release has a date"
    assert releases[1][0] == kdt.__version__
    assert subsections <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
