"""What the dashboard shows, computed from a log dir with ``kdt.Report``.

No web framework here: ``LogDirData`` answers the plugin's routes with JSON-ready dicts
and SVG text, so it is testable without a server. The report is reloaded when a records
file changed (mtime or size), so a log dir that is still being written stays current;
figures are the ``keras_dp_tools.report.plots`` figures (the notebook's and the HTML report's),
rendered as SVG on the server from a copy of the data thinned to what a chart can show.
A strategy comparison recorded under the log dir (``strategy_comparison.json``) is
shown too (``comparisons``), also when the log dir holds no records.
"""

from __future__ import annotations

import io
import math
import threading
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pandas as pd

from keras_dp_tools.report import comparison as comparison_view
from keras_dp_tools.report.summary_fields import READING_NOTE, READING_TITLE, summary_table

# Most points a line chart gets; longer series are averaged over consecutive rows.
MAX_POINTS = 2000
# Most per-window breakdown charts listed (the latest ones).
MAX_WINDOWS = 50
# A report is reloaded at most this often while its files keep changing.
MIN_RELOAD_SECONDS = 2.0
_FIGURE_CACHE_SIZE = 64
# Figures of one run (and worker): keras_dp_tools.report.plots function -> what it shows.
FIGURES = {
    "step_time": "Wall time per step",
    "comm_share": "Communication and wait share of profiled steps",
    "sync_wait": "Sync wait per replica (stragglers)",
    "gpu_utilization": "GPU utilization over time",
}
# Figures of a multi-worker run's worker view (all workers): the function's module.
WORKER_FIGURES = {
    "worker_view": "keras_dp_tools.report.worker_plots",
    "worker_wait": "keras_dp_tools.report.plots",
    "worker_wait_map": "keras_dp_tools.report.worker_plots",
}
# rc_context changes matplotlib's global settings: one SVG export at a time.
_SVG_LOCK = threading.Lock()


def _stat_key(paths) -> tuple:
    """(path, mtime, size) of each file: it changes when one is written or replaced."""
    key = []
    for path in paths:
        try:
            stat = path.stat()
        except OSError:  # removed or replaced between the listing and now
            continue
        key.append((str(path), stat.st_mtime_ns, stat.st_size))
    return tuple(key)


def _files_key(log_dir: Path) -> tuple:
    from keras_dp_tools.records.reader import find_record_files

    try:
        return _stat_key(find_record_files(log_dir))
    except FileNotFoundError:
        return ()


def _comparisons_key(log_dir: Path) -> tuple:
    from keras_dp_tools.records.comparison import comparison_path, find_comparisons

    return _stat_key(comparison_path(folder) for folder in find_comparisons(log_dir))


def json_value(value):
    """A cell as JSON: NaN and NA as null, timestamps as ISO text, numpy as Python."""
    if isinstance(value, (list, tuple, np.ndarray)):
        return [json_value(item) for item in value]
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, pd.Timestamp):
        return value.isoformat()
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def table(frame: pd.DataFrame, index: bool = False) -> dict:
    """A DataFrame as ``{"columns": [...], "rows": [[...], ...]}`` for the page's tables."""
    if index:
        frame = frame.reset_index()
    return {
        "columns": [str(column) for column in frame.columns],
        "rows": [[json_value(value) for value in row] for row in frame.itertuples(index=False)],
    }


def for_worker(report, worker: int | None):
    """The part of ``report`` recorded by one worker (all of it for None)."""
    if worker is None:
        return report
    frames = report.frames.frames()
    return _replace(report, **{n: f[f["worker"] == worker] for n, f in frames.items()})


def thin(frame: pd.DataFrame, by: list[str], order: str, limit: int = MAX_POINTS):
    """At most ``limit`` rows per group of ``by``: consecutive rows (in ``order``)
    averaged in equal buckets: numbers by their mean, ``order`` and other columns by
    their first.
    Returns the frame and the rows per bucket (1 when nothing was thinned)."""
    sizes = frame.groupby(by).size() if len(frame) else pd.Series(dtype="int64")
    if sizes.empty or sizes.max() <= limit:
        return frame, 1
    rows_per_point = math.ceil(sizes.max() / limit)
    frame = frame.sort_values([*by, order], kind="stable")
    bucket = frame.groupby(by).cumcount() // rows_per_point
    numbers = frame.select_dtypes("number").columns.difference(by)
    aggregations = {
        column: ("mean" if column in numbers and column != order else "first")
        for column in frame.columns
        if column not in by
    }
    thinned = frame.groupby([*[frame[c] for c in by], bucket.rename("_bucket")]).agg(aggregations)
    return thinned.reset_index().drop(columns="_bucket"), rows_per_point


def svg(figure, salt: str) -> str:
    """A matplotlib figure as inline SVG text: text stays text (searchable, small), and
    ``salt`` keeps the clip-path ids of several figures on one page apart."""
    import matplotlib

    buffer = io.StringIO()
    with _SVG_LOCK, matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": salt}):
        figure.savefig(buffer, format="svg")
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def summary_entries(summary: pd.DataFrame) -> list[dict]:
    """One run's ``Report.summary()`` as the page shows it, a dict per field: ``field``
    (the column), ``label``, ``unit``, ``value`` (the number, for machines) and
    ``shown`` (the text people read: shares in %), from ``summary_fields``."""
    if summary.empty:
        return []
    table = summary_table(summary.iloc[:1])
    row = summary.iloc[0]
    return [
        {
            "field": entry["field"],
            "label": entry["label"],
            "unit": entry["unit"],
            "value": json_value(row[entry["field"]]),
            "shown": entry["value"],
        }
        for entry in table.to_dict("records")
    ]


class LogDirData:
    """The dashboard's data for one log dir, reloaded when its records change."""

    def __init__(self, log_dir: str | Path):
        self.log_dir = Path(log_dir) if log_dir else None
        self._lock = threading.Lock()
        self._key: tuple | None = None
        self._checked = 0.0
        self._report = None
        self._error: str | None = None
        self._figures: OrderedDict[tuple, str] = OrderedDict()
        self._comparisons_key: tuple | None = None
        self._comparisons: list = []
        self._comparisons_error: str | None = None

    # -- loading -------------------------------------------------------------

    def report(self):
        """The current Report (None when the log dir holds no records yet)."""
        with self._lock:
            now = time.monotonic()
            if self._report is not None and now - self._checked < MIN_RELOAD_SECONDS:
                return self._report
            self._checked = now
            key = _files_key(self.log_dir) if self.log_dir else ()
            if key != self._key:
                self._load(key)
            return self._report

    def _load(self, key: tuple) -> None:
        from keras_dp_tools.report.facade import Report

        self._key = key
        self._figures.clear()
        if not key:
            self._report, self._error = None, None
            return
        try:
            self._report, self._error = Report.load([path for path, _, _ in key]), None
        except (OSError, ValueError) as error:  # a file being replaced, a bad record
            self._error = f"{type(error).__name__}: {error}"

    def recorded_comparisons(self) -> list:
        """The strategy comparisons under the log dir (``report.comparison.
        RecordedComparison``), reread when a record changed."""
        key = _comparisons_key(self.log_dir) if self.log_dir else ()
        with self._lock:
            if key != self._comparisons_key:
                # A record being replaced or a bad one is left out, and its error kept
                # for as long as the files stay as they are.
                errors = []
                self._comparisons = comparison_view.load_comparisons(self.log_dir, errors)
                self._comparisons_error = "; ".join(errors) or None
                self._comparisons_key = key  # only once loaded: a failure is tried again
            return self._comparisons

    def has_records(self) -> bool:
        return bool(self.log_dir) and bool(_files_key(self.log_dir))

    def has_data(self) -> bool:
        """Records, or a strategy comparison: something for the dashboard to show."""
        return self.has_records() or (bool(self.log_dir) and bool(_comparisons_key(self.log_dir)))

    # -- routes ----------------------------------------------------------------

    def comparisons(self) -> list[dict]:
        """Each strategy comparison under the log dir as the page shows it: ``where``
        (its folder under the log dir, "" for the log dir), ``title``, ``settings``
        (how it was measured), ``verdict``, ``note``, ``table`` (the labelled display
        table, ``text_columns`` its text columns), ``best`` and ``code``."""
        shown = []
        text = comparison_view.text_headings()
        for found in self.recorded_comparisons():
            display = comparison_view.display_table(found.table)
            shown.append(
                {
                    "where": found.where,
                    "title": found.title,
                    "settings": found.settings_line(),
                    "verdict": found.verdict,
                    "note": found.note,
                    "candidates": [str(name) for name in found.table["candidate"]],
                    "table": table(display),
                    "text_columns": text,
                    "best": found.best,
                    "code": found.code,
                }
            )
        return shown

    def runs(self) -> dict:
        """Runs with their workers, newest first, the scaling table for a sweep, and the
        strategy comparisons (``comparisons``)."""
        comparisons = self.comparisons()
        errors = [error for error in (self._error, self._comparisons_error) if error]
        error = "; ".join(errors) or None
        report = self.report()
        if report is None:
            return {
                "log_dir": str(self.log_dir),
                "runs": [],
                "error": error,
                "comparisons": comparisons,
            }
        runs = report.runs.groupby("run", sort=False).agg(
            start=("time", "min"),
            workers=("worker", lambda workers: sorted({int(w) for w in workers})),
            replicas=("replicas", "max"),
            strategy=("strategy", "first"),
        )
        runs = runs.sort_values("start", ascending=False)
        listing = [
            {
                "run": run,
                "start": json_value(pd.to_datetime(row.start, unit="s").floor("s")),
                "workers": row.workers,
                "replicas": json_value(row.replicas),
                "strategy": json_value(row.strategy),
            }
            for run, row in runs.iterrows()
        ]
        sweep = report.step_parts.all["replicas"].nunique() > 1  # the wide frame: not built
        return {
            "log_dir": str(self.log_dir),
            "runs": listing,
            "error": error,
            "scaling": table(report.compare().round(4)) if sweep else None,
            "comparisons": comparisons,
        }

    def run(self, run: str, worker: int | None) -> dict:
        """Summary, advice, windows and sync wait of one run (one worker, or all)."""
        part = self._part(run, worker)
        summary = part.summary(advice=False)
        # Each Finding as the page reads it (its message is the item's title).
        advice = [{**finding.to_dict(), "title": finding.message} for finding in part.advice()]
        header = part.runs.iloc[-1]
        windows = part.windows.sort_values(["time", "worker"]).tail(MAX_WINDOWS)
        replicas = part.replicas
        sync_wait = {}
        if not replicas.empty:
            by = ["worker", "replica"]
            waits = replicas.groupby(by)["sync_wait_ms"].agg(["mean", "max", "count"])
            sync_wait["by_replica"] = table(waits.round(3), index=True)
            if replicas["worker"].nunique() > 1:
                by_worker = replicas.groupby("worker")["sync_wait_ms"].agg(["mean", "max"])
                sync_wait["by_worker"] = table(by_worker.round(3), index=True)
        gpu_reason = part.runs["gpu_reason"].dropna()
        return {
            "run": run,
            "worker": worker,
            "workers": sorted(int(w) for w in part.runs["worker"].unique()),
            "header": {
                name: json_value(header.get(name))
                for name in (
                    "strategy",
                    "replicas",
                    "workers",
                    "global_batch",
                    "devices",
                    "hostname",
                    "keras_package",
                    "keras_version",
                    "tf_version",
                )
            },
            "summary": summary_entries(summary),
            "reading": {"title": READING_TITLE, "lines": list(READING_NOTE)},
            "advice": advice,
            "windows": table(
                windows[
                    [
                        "worker",
                        "window",
                        "start_step",
                        "end_step",
                        "status",
                        "reason",
                        "steps_analysed",
                        "profile_run",
                    ]
                ]
            ),
            "sync_wait": sync_wait,
            "workers_view": _workers_view(part) if worker is None else None,
            "gpu_available": not part.gpu.dropna(subset=["util_gpu"]).empty,
            "gpu_reason": json_value(gpu_reason.iloc[-1]) if len(gpu_reason) else None,
            "figures": FIGURES,
            "steps_recorded": len(part.step_parts.all),  # the wide frame is not built
        }

    def figure(
        self,
        name: str,
        run: str | None,
        worker: int | None,
        window_index: int | None,
        comparison: str | None = None,
    ) -> str:
        """One figure as SVG text (cached until the records change); ``window_index``
        picks one profiler window of the breakdown figure, ``comparison`` (a ``where``
        of ``comparisons()``) the comparison of the ``strategy_comparison`` chart."""
        if name == "strategy_comparison":
            found = self._comparison(comparison or "")
            report, cache_key = None, (self._comparisons_key, name, found.where)
        else:
            report = self.report()
            if report is None:
                raise LookupError("The log dir holds no keras_dp_tools records yet.")
            cache_key = (self._key, name, run, worker, window_index)
        with self._lock:
            if cache_key in self._figures:
                self._figures.move_to_end(cache_key)
                return self._figures[cache_key]
        if report is None:
            figure = self._draw_comparison(found)
        else:
            figure = self._draw(report, name, run, worker, window_index)
        text = svg(figure, salt=f"{name}-{run}-{worker}-{window_index}-{comparison}")
        with self._lock:
            self._figures[cache_key] = text
            while len(self._figures) > _FIGURE_CACHE_SIZE:
                self._figures.popitem(last=False)
        return text

    # -- helpers -----------------------------------------------------------------

    def _comparison(self, where: str):
        found = {found.where: found for found in self.recorded_comparisons()}
        if where not in found:
            known = ", ".join(repr(key) for key in found) or "none"
            raise LookupError(
                f"No strategy comparison at {where!r} in {self.log_dir}; it has {known}."
            )
        return found[where]

    @staticmethod
    def _draw_comparison(found):
        from keras_dp_tools.report import plots

        figure = plots.strategy_comparison(found)
        if isinstance(figure, plots.Omitted):
            raise LookupError(str(figure))
        return figure

    def _part(self, run: str, worker: int | None):
        report = self.report()
        if report is None:
            raise LookupError("The log dir holds no keras_dp_tools records yet.")
        if run not in set(report.runs["run"]):
            known = ", ".join(report.runs["run"].drop_duplicates())
            raise LookupError(f"No run {run!r} in {self.log_dir}; it has {known}.")
        part = for_worker(report.for_run(run), worker)
        if part.runs.empty:
            raise LookupError(f"Run {run!r} has no worker {worker}.")
        return part

    def _draw(self, report, name: str, run, worker, window_index):
        from keras_dp_tools.report import plots

        if name == "scaling":
            return plots.scaling(report)
        part = self._part(run, worker)
        if name == "step_breakdown":
            return plots.step_breakdown(_window_part(part, window_index), run)
        if name in WORKER_FIGURES:
            return _worker_figure(part, name, run)
        if name not in FIGURES:
            known = ", ".join([*FIGURES, *WORKER_FIGURES])
            raise LookupError(f"No figure {name!r}; the dashboard draws {known}.")
        per_point = 1
        if name == "step_time":  # warm-up calls are never drawn: leave them out first
            own = part.step_parts.all  # the steps' own columns: all that step_time reads
            timed = own[~own["warmup"].fillna(False).astype(bool)]
            steps, per_point = thin(timed, ["worker"], "step")
            part = _replace(part, steps=steps)
        elif name == "gpu_utilization":
            gpu, per_point = thin(part.gpu, ["worker", "gpu"], "time")
            part = _replace(part, gpu=gpu)
        else:  # per profiled step: keep every k-th one past the limit
            profiled = part.steps.dropna(subset=["trace_step_ms"])
            per_point = max(1, math.ceil(len(profiled) / MAX_POINTS))
            kept = profiled.iloc[::per_point]
            replicas = part.replicas[part.replicas["step"].isin(kept["step"])]
            part = _replace(part, steps=kept, replicas=replicas)
        figure = getattr(plots, name)(part, run)
        if per_point > 1:
            how = "mean of" if name in ("step_time", "gpu_utilization") else "one in"
            figure.suptitle(f"each point: {how} {per_point} consecutive rows", fontsize="small")
        return figure


def _replace(report, **frames):
    """A Report with some frames replaced (the others as they are: the steps in parts)."""
    from keras_dp_tools.report.facade import Report

    given = {name: frame.reset_index(drop=True) for name, frame in frames.items()}
    return Report.of_frames(report.frames.replace(**given))


def _window_part(part, window_index: int | None):
    """The steps and replica rows of one profiler window (``part`` is one worker's)."""
    if window_index is None:
        return part
    rows = part.windows[part.windows["window"] == window_index]
    if rows.empty:
        raise LookupError(f"No profiler window {window_index}.")
    first, end = rows.iloc[-1]["start_step"], rows.iloc[-1]["end_step"]
    steps = part.steps[part.steps["step"].between(first, end - 1)]
    replicas = part.replicas[part.replicas["window"] == window_index]
    return _replace(part, steps=steps, replicas=replicas)


def _workers_view(part) -> dict | None:
    """A multi-worker run's worker view as the page shows it: the ranked worker table
    (``analysis.worker_digest``: the top few of many, ``rest`` the lines for the others)
    and the names of its figures; None for a run of one worker."""
    from keras_dp_tools.analysis import worker_digest

    shown, rest = worker_digest.ranked_workers(part.workers)
    if shown["worker"].nunique() < 2:
        return None
    many = part.workers["worker"].nunique() > worker_digest.ALL_WORKERS_UP_TO
    return {
        "table": table(shown.drop(columns="run").round(3)),
        "rest": rest,
        "figures": ["worker_view", "worker_wait_map" if many else "worker_wait"],
    }


def _worker_figure(part, name: str, run):
    """A figure of the worker view (``WORKER_FIGURES``); the per-step lines of
    ``worker_wait`` thinned as the step times are. ``LookupError`` with the reason
    where there is nothing to draw (one worker)."""
    import importlib

    from keras_dp_tools.report import plots

    per_point = 1
    if name == "worker_wait":
        timed = part.step_parts.all.dropna(subset=["worker_wait_ms"])
        steps, per_point = thin(timed, ["worker"], "step")
        part = _replace(part, steps=steps)
    figure = getattr(importlib.import_module(WORKER_FIGURES[name]), name)(part, run)
    if isinstance(figure, plots.Omitted):
        raise LookupError(str(figure))
    if per_point > 1:
        figure.suptitle(f"each point: mean of {per_point} consecutive rows", fontsize="small")
    return figure
