"""Headless Chromium for the browser tests of the dashboard: the page must render from
what the local server serves, with no display and no host but loopback."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def browser() -> str | None:
    return next(filter(None, map(shutil.which, BROWSERS)), None)


def headless(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """Chromium without a display, sandbox (CI runs as root) or any host but loopback:
    the page must render from what TensorBoard serves."""
    profile = Path(os.environ.get("TMPDIR", "/tmp")) / f"kdp-chromium-{os.getpid()}"
    command = [
        browser(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        "--virtual-time-budget=60000",
        *args,
    ]
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
