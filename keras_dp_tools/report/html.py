"""A static HTML page of a report: summary, advice and plots, in one self-contained file.

The figures and the summary table come from ``keras_dp_tools.report.plots``, as in the notebook.
A plot with nothing to draw (GPU utilization on a CPU run) is one line saying why. A
strategy comparison recorded in the log dir (``kdt.compare_strategies``) gets a section
of its own (``keras_dp_tools.report.comparison``), also on a page with no runs.
"""

from __future__ import annotations

import base64
import html
import io
import os
from pathlib import Path

from keras_dp_tools.analysis import worker_digest
from keras_dp_tools.common.warn import warn
from keras_dp_tools.report import comparison as comparison_view
from keras_dp_tools.report import plots, summary_fields, worker_plots

# Plots of one run, in reading order, with their captions.
_RUN_PLOTS = (
    (plots.step_time, "Wall time per step (warm-up and profiled steps marked)"),
    (plots.step_breakdown, "Where each profiled step goes"),
    (plots.comm_share, "Communication share over the profiled steps"),
    (plots.sync_wait, "Sync wait per replica (stragglers)"),
    (plots.gpu_utilization, "GPU utilization"),
)
_STYLE = (
    "body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;}"
    "table{border-collapse:collapse;font-size:small;}td,th{padding:2px 8px;text-align:left;}"
    "td+td,th+th{text-align:right;}tr:nth-child(even){background:#f4f4f4;}"
    "img{max-width:100%;}.note,.omitted{color:#555;font-size:small;}"
    "td.unit,th.unit{text-align:left;}.reading{color:#444;font-size:small;}"
    ".reading h3{margin-bottom:0;}"
    "td.text,th.text{text-align:left;}pre.code{background:#f4f4f4;padding:6px 8px;}"
    # Numbers stay on one line; a long text (a failed candidate's reason) wraps.
    ".comparison td.value{white-space:nowrap;}"
    ".comparison td.text{max-width:28em;overflow-wrap:anywhere;}"
)


def _summary_html(table) -> str:
    """The labelled summary (``summary_fields.summary_table``): label, the value of each
    run, unit; each row names its ``Report.summary()`` column; then how to read it."""
    runs = summary_fields.value_columns(table)
    cell = html.escape
    header = "".join(f"<th>{cell(run)}</th>" for run in runs)
    rows = "".join(
        f'<tr data-field="{cell(row["field"])}" '
        f'title="Report.summary() column {cell(row["field"])}">'
        f'<td class="label">{cell(row["label"])}</td>'
        + "".join(f'<td class="value">{cell(row[run])}</td>' for run in runs)
        + f'<td class="unit">{cell(row["unit"])}</td></tr>'
        for row in table.to_dict("records")
    )
    note = "".join(f"<li>{cell(sentence)}</li>" for sentence in summary_fields.READING_NOTE)
    return (
        f'<table id="summary"><tr><th></th>{header}<th class="unit">unit</th></tr>{rows}</table>'
        f'<div class="reading" id="how-to-read"><h3>{cell(summary_fields.READING_TITLE)}</h3>'
        f"<ul>{note}</ul></div>"
    )


def _figure_html(figure, caption: str) -> str:
    if isinstance(figure, plots.Omitted):
        return (
            f'<p class="omitted"><b>{html.escape(figure.title)}</b> left out: '
            f"{html.escape(figure.reason)}.</p>"
        )
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return (
        f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
    )


def _workers_html(report, run, index: int) -> list[str]:
    """A multi-worker run's worker view: the ranked worker table (the top few of many,
    ``analysis.worker_digest``), who keeps the job waiting, and the waits per worker and
    step (lines for a few workers, a heat map for many); nothing for one worker."""
    mine = report.workers[report.workers["run"] == run]
    shown, rest = worker_digest.ranked_workers(mine)
    if shown["worker"].nunique() < 2:
        return []
    cell = html.escape
    columns = [name for name in shown.columns if name != "run"]
    header = "".join(f"<th>{cell(name)}</th>" for name in columns)
    rows = "".join(
        f'<tr data-worker="{int(row["worker"])}">'
        + "".join(f"<td>{cell(_cell_text(row[name]))}</td>" for name in columns)
        + "</tr>"
        for row in shown.to_dict("records")
    )
    many = mine["worker"].nunique() > worker_digest.ALL_WORKERS_UP_TO
    waits = worker_plots.worker_wait_map if many else plots.worker_wait  # lines: a few
    return [
        "<h3>Workers</h3>",
        f'<table id="workers-{index}"><tr>{header}</tr>{rows}</table>',
        *(f'<p class="note">{cell(line)}</p>' for line in rest),
        _figure_html(worker_plots.worker_view(report, run), _WORKER_CAPTION),
        _figure_html(waits(report, run), "Wait for the last worker to enter, per step"),
    ]


_WORKER_CAPTION = (
    "Per worker: median wait for the last worker to enter a step, and the steps it "
    "entered last (the worker the others wait for in red)"
)


def _cell_text(value) -> str:
    if isinstance(value, float):
        return "" if value != value else f"{value:.3f}"
    return str(value)


def _run_figures(report) -> list[str]:
    runs = list(report.runs["run"].drop_duplicates())
    parts = []
    for index, run in enumerate(runs):
        if len(runs) > 1:
            parts.append(f"<h3>Run {html.escape(str(run))}</h3>")
        parts += [_figure_html(plot(report, run), caption) for plot, caption in _RUN_PLOTS]
        parts += _workers_html(report, run, index)
    if report.steps["replicas"].nunique() > 1:
        parts.append(_figure_html(plots.scaling(report), "Scaling with replicas"))
    return parts


_CHART_CAPTION = "Median over rounds; whiskers from the slowest to the fastest round"


def _comparison_html(found: comparison_view.RecordedComparison, index: int) -> str:
    """One comparison: how it was measured, the verdict, the labelled table, the chart
    and the winner's code."""
    cell = html.escape
    shown = comparison_view.display_table(found.table)
    text = comparison_view.text_headings()
    header = "".join(
        f'<th class="{"text" if name in text else "value"}">{cell(name)}</th>'
        for name in shown.columns
    )
    rows = "".join(
        f'<tr data-candidate="{cell(candidate)}">'
        + "".join(
            f'<td class="{"text" if name in text else "value"}">{cell(value)}</td>'
            for name, value in zip(shown.columns, values, strict=True)
        )
        + "</tr>"
        for candidate, values in zip(found.table["candidate"], shown.values.tolist(), strict=True)
    )
    note = f'<p class="note">({cell(found.note)})</p>' if found.note else ""
    code = (
        f"<p>The code that builds the winner, {cell(found.best)}:</p>"
        f'<pre class="code" id="comparison-{index}-code">{cell(found.code)}</pre>'
        if found.code
        else ""
    )
    return (
        f'<section class="comparison" id="comparison-{index}">'
        f"<h2>{cell(found.title)}</h2>"
        f'<p class="note">{cell(found.settings_line())}</p>'
        f'<p class="verdict" id="comparison-{index}-verdict">{cell(found.verdict)}</p>{note}'
        f'<table id="comparison-{index}-table"><tr>{header}</tr>{rows}</table>'
        + _figure_html(plots.strategy_comparison(found), _CHART_CAPTION)
        + code
        + "</section>"
    )


def _report_html(report) -> list[str]:
    advice_items = (
        "".join(
            f"<li><b>{html.escape(finding.severity)}: {html.escape(finding.message)}</b>. "
            f"{html.escape(finding.evidence)} <i>Fix:</i> {html.escape(finding.fix)}</li>"
            for finding in report.advice()
        )
        or "<li>No findings: nothing stands out in the recorded numbers.</li>"
    )
    return [
        "<h2>Summary</h2>",
        _summary_html(plots.summary_table(report)),
        "<h2>Advice</h2>",
        f"<ul>{advice_items}</ul>",
        "<h2>Plots</h2>",
        *_run_figures(report),
    ]


def write_html(
    report,
    path: str | os.PathLike,
    title: str = "keras_dp_tools report",
    comparisons: list | None = None,
) -> Path:
    """Writes ``report`` as one HTML file (images inlined) and returns its path.

    Args:
        report: a ``kdt.Report``, or None for a page of strategy comparisons alone.
        path: the HTML file to write.
        title: the page's title.
        comparisons: the strategy comparisons to show
            (``keras_dp_tools.report.comparison.load_comparisons``); by default those
            recorded under the log dirs the report was loaded from (``report.log_dirs``).
            Each gets a "Strategy comparison" section above the runs.

    Example:

    ```python
    report = kdt.Report.load("runs/strategies")
    write_html(report, "report.html")  # the runs, and the comparison recorded there
    ```
    """
    path = Path(path)
    if comparisons is None:
        log_dirs = getattr(report, "log_dirs", [])
        errors = []  # a broken comparison record must not cost the page
        comparisons = comparison_view.load_comparisons(log_dirs, errors=errors)
        for error in errors:
            warn(f"strategy comparison left out: {error}")
    if report is None and not comparisons:
        raise ValueError(
            "Nothing to write: no report (None) and no strategy comparison; pass a "
            "kdt.Report, or comparisons=load_comparisons(log_dir)."
        )
    body = [
        f"<h1>{html.escape(title)}</h1>",
        *(_comparison_html(found, index) for index, found in enumerate(comparisons)),
        *(_report_html(report) if report is not None else []),
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{_STYLE}</style></head><body>{''.join(body)}</body></html>",
        encoding="utf-8",
    )
    return path
