"""What a person reads in each view of a report: the labelled summary of the HTML page,
the dashboard page and ``Report.text()``, parsed back into rows, and a check of a shown
value against the numeric ``Report.summary()`` that does not reuse the package's
formatting.
"""

from __future__ import annotations

import math
import re
from html.parser import HTMLParser

import pandas as pd

# Report.summary() holds these as fractions of the step; every view shows them in %.
PERCENT_OF_FRACTION = {"comm_share", "wait_share", "outside_steps_share"}


class ReportPage(HTMLParser):
    """A rendered page (the HTML report, or the dashboard's DOM): texts by element id,
    headings in order (``"h2 Summary"``), the summary table's rows by ``data-field``
    (``{"label", "values", "unit"}``), the "How to read it" lines, SVG and figure counts,
    and every table with an id as rows of cell texts (``tables``)."""

    def __init__(self, html: str = ""):
        super().__init__()
        self.texts: dict[str, str] = {}
        self.headings: list[str] = []
        self.summary: dict[str, dict] = {}
        self.reading: list[str] = []
        self.svgs = 0
        self.figures = 0
        self.tables: dict[str, list[list[str]]] = {}
        self._table: str | None = None
        self._open: list[tuple] = []  # (tag, text parts, id, classes) of open elements
        self._row: dict | None = None
        self._in_reading = 0
        if html:
            self.feed(html)
            self.close()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        classes = (attrs.get("class") or "").split()
        if tag == "svg":
            self.svgs += 1
        if "figure" in classes:
            self.figures += 1
        if tag == "tr" and "data-field" in attrs:
            self._row = {"label": "", "values": [], "unit": ""}
            self.summary[attrs["data-field"]] = self._row
        if tag == "table" and attrs.get("id"):
            self._table = attrs["id"]
            self.tables[self._table] = []
        if tag == "tr" and self._table:
            self.tables[self._table].append([])
        if attrs.get("id") == "how-to-read":
            self._in_reading = len(self._open) + 1
        self._open.append((tag, [], attrs.get("id"), classes))

    def handle_endtag(self, tag):
        while self._open:
            opened, parts, element_id, classes = self._open.pop()
            text = " ".join("".join(parts).split())
            if self._open:  # the parent's text holds its children's
                self._open[-1][1].append("".join(parts))
            if element_id:
                self.texts[element_id] = text
            if opened in ("h1", "h2", "h3"):
                self.headings.append(f"{opened} {text}")
            if opened in ("td", "th") and self._table:
                self.tables[self._table][-1].append(text)
            if opened == "table":
                self._table = None
            if opened == "li" and self._in_reading:
                self.reading.append(text)
            if opened == "td" and self._row is not None:
                if "label" in classes:
                    self._row["label"] = text
                elif "value" in classes:
                    self._row["values"].append(text)
                elif "unit" in classes:
                    self._row["unit"] = text
            if self._in_reading and len(self._open) < self._in_reading:
                self._in_reading = 0
            if opened == tag:
                break
        if tag == "tr":
            self._row = None

    def handle_data(self, text):
        if self._open:
            self._open[-1][1].append(text)


def dashboard_summary(answer: dict) -> dict[str, dict]:
    """The summary of the dashboard's data (``LogDirData.run``), in the shape of
    ``ReportPage.summary``: what the page will show of each field."""
    return {
        entry["field"]: {"label": entry["label"], "values": [entry["shown"]], "unit": entry["unit"]}
        for entry in answer["summary"]
    }


def text_summary(text: str) -> dict[str, dict]:
    """The summary of ``Report.text()``, by ``Report.summary()`` column: its label, the
    value of each run as printed and its unit (the same shape as ``ReportPage.summary``)."""
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("Summary of run"))
    header = lines[first + 1]
    field_at = header.rindex("column")
    unit_at = header.rindex("unit", 0, field_at)
    rows = {}
    for line in lines[first + 2 :]:
        if not line.strip():
            break
        label, *values = re.split(r"\s{2,}", line[:unit_at].strip())
        rows[line[field_at:].strip()] = {
            "label": label,
            "values": values,
            "unit": line[unit_at:field_at].strip(),
        }
    return rows


def assert_shows(field: str, shown: str, value) -> None:
    """``shown`` (a view's text) says ``value`` (``Report.summary()``'s number): a share
    in percent, rounded to the digits shown but no coarser than 5 %; "not measured" for
    NaN; a time to the second."""
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        assert shown == "not measured", (field, shown)
    elif isinstance(value, pd.Timestamp):
        assert pd.Timestamp(shown) == value.floor("s"), (field, shown, value)
    elif isinstance(value, str):
        assert shown == value, (field, shown)
    else:
        expected = 100 * float(value) if field in PERCENT_OF_FRACTION else float(value)
        number = float(shown.replace(",", ""))
        decimals = len(shown.split(".")[1]) if "." in shown else 0
        assert abs(number - expected) <= 0.5 * 10**-decimals + 1e-9, (field, shown, expected)
        assert math.isclose(number, expected, rel_tol=0.05, abs_tol=1e-9), (field, shown, expected)
