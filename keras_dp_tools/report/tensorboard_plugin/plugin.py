"""The "Data parallel" TensorBoard plugin: routes over ``LogDirData``.

TensorBoard loads the page in an iframe whose base URL is this plugin's route prefix
(``data/plugin/data_parallel/``) and calls ``render()`` of ``static/index.js``: plain
JavaScript shipped in the package, no build step and nothing fetched from the network.
"""

from __future__ import annotations

import json
import logging
import mimetypes
import time
from pathlib import Path

from tensorboard.backend import http_util
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from keras_dp_tools.report.tensorboard_plugin.data import LogDirData

PLUGIN_NAME = "data_parallel"
STATIC_DIR = Path(__file__).resolve().parent / "static"
_ACTIVE_SECONDS = 10.0  # how long is_active's answer stands (it searches the log dir)
logger = logging.getLogger("keras_dp_tools")


class DataParallelPlugin(base_plugin.TBPlugin):
    """The "Data parallel" tab: keras_dp_tools records of the log dir, per run and worker."""

    plugin_name = PLUGIN_NAME

    def __init__(self, context):
        self._data = LogDirData(context.logdir)
        self._active = (0.0, False)

    def get_plugin_apps(self):
        return {
            "/static/*": self._serve_static,
            "/runs": self._serve_runs,
            "/run": self._serve_run,
            "/figure": self._serve_figure,
        }

    def is_active(self) -> bool:
        checked, active = self._active
        if not active and time.monotonic() - checked > _ACTIVE_SECONDS:
            active = self._data.has_data()  # records, or a strategy comparison alone
            self._active = (time.monotonic(), active)
        return active

    def frontend_metadata(self):
        return base_plugin.FrontendMetadata(
            es_module_path="/static/index.js", tab_name="Data parallel"
        )

    # -- routes --------------------------------------------------------------

    @wrappers.Request.application
    def _serve_static(self, request):
        name = request.path.rsplit("/static/", 1)[-1]
        path = (STATIC_DIR / name).resolve()
        if path.parent != STATIC_DIR or not path.is_file():  # no way out of static/
            return http_util.Respond(request, "Not found", "text/plain", code=404)
        content_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        if path.suffix == ".js":
            content_type = "text/javascript"
        return http_util.Respond(request, path.read_bytes(), content_type)

    @wrappers.Request.application
    def _serve_runs(self, request):
        return self._json(request, self._data.runs)

    @wrappers.Request.application
    def _serve_run(self, request):
        return self._json(
            request, lambda: self._data.run(request.args.get("run", ""), _worker(request))
        )

    @wrappers.Request.application
    def _serve_figure(self, request):
        window_index = request.args.get("window")
        try:
            text = self._data.figure(
                request.args.get("name", ""),
                request.args.get("run"),
                _worker(request),
                None if window_index in (None, "") else int(window_index),
                request.args.get("comparison"),
            )
        except (LookupError, ValueError) as error:
            return http_util.Respond(request, str(error), "text/plain", code=404)
        return http_util.Respond(request, text, "image/svg+xml")

    @staticmethod
    def _json(request, answer):
        try:
            body = answer()
        except (LookupError, ValueError) as error:
            return http_util.Respond(request, {"error": str(error)}, "application/json", code=404)
        return http_util.Respond(request, json.dumps(body), "application/json")


def _worker(request) -> int | None:
    worker = request.args.get("worker", "")
    return None if worker in ("", "all") else int(worker)
