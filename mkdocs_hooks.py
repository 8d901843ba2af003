"""MkDocs hooks (mkdocs.yml ``hooks:``): the changelog page is CHANGELOG.md itself.

The changelog stays at the repository's root, where its links say ``docs/<page>.md``;
on the site the pages sit next to the changelog page, so those links lose the prefix.
"""

import re
from pathlib import Path

CHANGELOG = Path(__file__).resolve().parent / "CHANGELOG.md"
DOCS_LINK = re.compile(r"\]\(docs/")


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri != "changelog.md":
        return markdown
    return DOCS_LINK.sub("](", CHANGELOG.read_text())
