"""A static HTML page of a report: summary, advice and plots, in one self-contained file."""

from __future__ import annotations

import base64
import html
import io
import os
from pathlib import Path

from keras_dp_tools import plots


def _figure_html(figure, caption: str) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return (
        f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
    )


def write_html(report, path: str | os.PathLike, title: str = "keras_dp_tools report") -> Path:
    """Writes ``report`` as one HTML file (images inlined) and returns its path."""
    path = Path(path)
    summary = report.summary(advice=False)
    advice = report.advice()
    advice_items = (
        "".join(
            f"<li><b>{html.escape(item.severity)}: {html.escape(item.title)}</b>. "
            f"{html.escape(item.evidence)} <i>Fix:</i> {html.escape(item.fix)}</li>"
            for item in advice
        )
        or "<li>No findings: nothing stands out in the recorded numbers.</li>"
    )
    figures = [
        (plots.step_time(report), "Wall time per step"),
        (plots.step_breakdown(report), "Where each profiled step goes"),
        (plots.comm_share(report), "Communication share over steps"),
        (plots.sync_wait(report), "Sync wait per replica (stragglers)"),
        (plots.gpu_utilization(report), "GPU utilization"),
    ]
    if report.steps["replicas"].nunique() > 1:
        figures.append((plots.scaling(report), "Scaling with replicas"))
    body = [
        f"<h1>{html.escape(title)}</h1>",
        "<h2>Summary</h2>",
        summary.round(3).to_html(border=0),
        "<h2>Advice</h2>",
        f"<ul>{advice_items}</ul>",
        "<h2>Plots</h2>",
        *(_figure_html(figure, caption) for figure, caption in figures),
    ]
    style = (
        "body{font-family:sans-serif;max-width:1100px;margin:2em auto;}"
        "table{border-collapse:collapse;font-size:small;}td,th{padding:2px 6px;}"
        "tr:nth-child(even){background:#f4f4f4;}img{max-width:100%;}"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{style}</style></head><body>{''.join(body)}</body></html>",
        encoding="utf-8",
    )
    return path
