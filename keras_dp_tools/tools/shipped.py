"""The docs' pages and the report notebook where a user has them: ``keras-dp docs`` and
``keras-dp notebook``.

A wheel carries copies of ``docs/*.md`` and ``notebooks/report.ipynb`` under
``keras_dp_tools/_shipped/`` (setup.py copies them when it builds the package), so a pip
user, who has no checkout, reads the same pages the output refers to. A package run
from a checkout (an editable install, ``PYTHONPATH``) reads the checkout's own files.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]  # keras_dp_tools/
SHIPPED = PACKAGE / "_shipped"  # in an installed package only
CHECKOUT = PACKAGE.parent
NOTEBOOK_NAME = "report.ipynb"


def docs_folder() -> Path:
    """The folder of the docs' pages.

    Returns:
        The installed copy (``keras_dp_tools/_shipped/docs``), else the checkout's
        ``docs/``.
    """
    return SHIPPED / "docs" if (SHIPPED / "docs").is_dir() else CHECKOUT / "docs"


def notebook_path() -> Path:
    """The report notebook.

    Returns:
        The installed copy, else the checkout's ``notebooks/report.ipynb``.
    """
    shipped = SHIPPED / NOTEBOOK_NAME
    return shipped if shipped.is_file() else CHECKOUT / "notebooks" / NOTEBOOK_NAME


def topics() -> dict[str, str]:
    """The docs' pages by topic.

    Returns:
        Topic (the page's file name without ``.md``) -> its title (first heading).

    Example:

    ```python
    from keras_dp_tools.tools.shipped import topics

    print(topics()["reading"])  # the page's title
    ```
    """
    found = {}
    for path in sorted(docs_folder().glob("*.md")):
        title = re.search(r"^# (.+)$", path.read_text(), re.M)
        found[path.stem] = title.group(1).strip() if title else path.stem
    return found


def page(topic: str) -> Path:
    """The page of a topic.

    Args:
        topic: ``reading``, ``reading.md`` or ``docs/reading.md``.

    Returns:
        The page's path (``changelog``: the checkout's CHANGELOG.md in a checkout).

    Raises:
        ValueError: no page has that name; the message lists the topics.

    Example:

    ```python
    from keras_dp_tools.tools.shipped import page

    print(page("reading").read_text()[:80])  # "# Reading the numbers ..."
    ```
    """
    name = Path(topic).name.removesuffix(".md")
    path = docs_folder() / f"{name}.md"
    if name == "changelog" and docs_folder() == CHECKOUT / "docs":
        path = CHECKOUT / "CHANGELOG.md"  # docs/changelog.md includes it when the site builds
    if not path.is_file():
        raise ValueError(
            f"No page {topic!r} in {docs_folder()}; topics: {', '.join(topics())} "
            "(`keras-dp docs` lists them with their titles)."
        )
    return path


def copy_notebook(destination: str | os.PathLike, force: bool = False) -> Path:
    """Writes a copy of the report notebook to ``destination`` (a file, or a folder to
    hold ``report.ipynb``); returns the path written. A copy of your own: Jupyter saves
    outputs into the file it opens, which in an installed package is not yours.

    Args:
        destination: a file, or a folder (existing, or ending in ``/``).
        force: replace an existing file.

    Returns:
        The path written.

    Raises:
        FileExistsError: the file exists and ``force`` is False.

    Example:

    ```python
    from keras_dp_tools.tools.shipped import copy_notebook

    copy_notebook("notebooks/")  # -> notebooks/report.ipynb, yours to run and save
    ```
    """
    target = Path(destination)
    if target.is_dir() or str(destination).endswith(("/", os.sep)):
        target = target / NOTEBOOK_NAME
    if target.exists() and not force:
        raise FileExistsError(f"{target} exists; pass --force to replace it.")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(notebook_path(), target)
    return target
