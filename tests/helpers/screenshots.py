"""Screenshots of the dashboard and the HTML report kept in docs/images, current without
churning git: next to each PNG a JSON snapshot of the page's structure (headings, the
summary's labels and units, the "How to read it" lines; never the numbers, which differ
on every run). A test that renders a page calls ``keep_screenshot``: when the structure
differs from the snapshot, or the image is missing, it rewrites both and fails, so the
change is seen and committed; otherwise it leaves them alone.
``KERAS_DP_UPDATE_SCREENSHOTS=1`` rewrites the PNG anyway (a restyled page with the same
structure).
"""

from __future__ import annotations

import difflib
import io
import json
import os
from pathlib import Path

import pytest

from tests.helpers import REPO

IMAGES = REPO / "docs" / "images"
# The top of the page, where the summary and the first charts are.
MAX_HEIGHT = 1600
# The docs embed these files: keep each small.
MAX_BYTES = 300_000


def page_structure(page, headings: list[str]) -> dict:
    """What a page looks like apart from its numbers: ``headings`` (those of ``page``,
    a ``tests.helpers.pages.ReportPage``, that do not name a run), the summary's label
    and unit per field, and the "How to read it" lines."""
    return {
        "headings": headings,
        "summary": {field: [row["label"], row["unit"]] for field, row in page.summary.items()},
        "how_to_read": page.reading,
    }


def small_png(screenshot: Path) -> bytes:
    """The top ``MAX_HEIGHT`` pixels of ``screenshot`` as a palette PNG under ``MAX_BYTES``
    (scaled down until it fits)."""
    from PIL import Image

    image = Image.open(screenshot).convert("RGB")
    image = image.crop((0, 0, image.width, min(image.height, MAX_HEIGHT)))
    while True:
        buffer = io.BytesIO()
        image.quantize(colors=128).save(buffer, format="PNG", optimize=True)
        if buffer.tell() <= MAX_BYTES or image.width < 400:
            return buffer.getvalue()
        image = image.resize((image.width * 4 // 5, image.height * 4 // 5), Image.LANCZOS)


def keep_screenshot(name: str, screenshot: Path, structure: dict) -> None:
    """Keeps docs/images/``name``.png (from ``screenshot``) and ``name``.json
    (``structure``) current; fails, saying what changed, when it rewrote them."""
    png, snapshot = IMAGES / f"{name}.png", IMAGES / f"{name}.json"
    text = json.dumps(structure, indent=2, ensure_ascii=False) + "\n"
    before = snapshot.read_text(encoding="utf-8") if snapshot.exists() else ""
    if png.exists() and before == text:
        if os.environ.get("KERAS_DP_UPDATE_SCREENSHOTS"):
            png.write_bytes(small_png(screenshot))
        return
    had_image = png.exists()
    IMAGES.mkdir(parents=True, exist_ok=True)
    png.write_bytes(small_png(screenshot))
    snapshot.write_text(text, encoding="utf-8")
    changes = difflib.unified_diff(
        before.splitlines(), text.splitlines(), str(snapshot), "now", lineterm="", n=1
    )
    pytest.fail(
        f"screenshots updated: commit docs/images ({png.name}, {snapshot.name}); the page "
        "changed:\n" + ("\n".join(changes) if had_image else "(no image before)")
    )
