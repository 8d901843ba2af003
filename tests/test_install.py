"""From a fresh clone: ``pip install .`` into a new virtual environment, then the README's
quickstart runs there, importing the installed package (not this checkout), and the
pages and the notebook the output refers to are there (``keras-dp docs``, ``keras-dp
notebook``).

The new environment sees nothing of this one (no ``--system-site-packages``, no
``PYTHONPATH``), so the install proves what setup.cfg declares: the dependencies, the
package's files (the dashboard's static files included) and the ``keras-dp`` command.
pip reuses its cache (``~/.cache/pip``) and the versions of constraints.txt, which makes
the install about 70 s with a warm cache and 3 minutes on a loaded 2-core machine.
"""

import os
import shutil
import subprocess
import sys

import pytest

import keras_dp_tools as kdt
from tests.helpers import REPO
from tests.helpers.doc_blocks import python_block


def clone_of_the_checkout(destination):
    """The files a fresh clone of this working tree holds: tracked ones and new ones git
    does not ignore (so uncommitted edits are what is installed), nothing built."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():  # a file deleted but not yet committed is listed, and gone
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    return destination


@pytest.mark.slow
def test_pip_install_of_a_clone_runs_the_readme_quickstart(tmp_path):
    clone = clone_of_the_checkout(tmp_path / "clone")
    venv = tmp_path / "venv"
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.pop("VIRTUAL_ENV", None)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env)
    python = str(venv / "bin" / "python")
    install = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "-c", "constraints.txt", "."],
        cwd=clone,
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]

    work = tmp_path / "work"
    work.mkdir()
    code = "import keras_dp_tools\nprint(keras_dp_tools.__file__)\n"
    code += python_block("README.md", "## Quickstart")
    done = subprocess.run(
        [python, "-c", code], cwd=work, capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]

    imported_from = done.stdout.splitlines()[0]
    assert imported_from.startswith(str(venv)), imported_from  # the install, not REPO
    report = kdt.Report.load(work / "runs" / "quickstart")
    assert report.steps["step"].tolist() == list(range(40))
    version = subprocess.run(
        [str(venv / "bin" / "keras-dp"), "--version"], capture_output=True, text=True, env=env
    )
    assert version.stdout.strip() == kdt.__version__
    static = venv.glob("lib/python*/site-packages/keras_dp_tools/report/tensorboard_plugin/static")
    assert {path.name for path in next(static).iterdir()} >= {"index.js", "style.css"}
    # What the output refers to, a pip user has (issue 34): the pages, the notebook.
    keras_dp = str(venv / "bin" / "keras-dp")
    page = subprocess.run(
        [keras_dp, "docs", "reading"], cwd=work, capture_output=True, text=True, env=env
    )
    assert page.stdout == (REPO / "docs" / "reading.md").read_text(), page.stderr
    where = subprocess.run(
        [keras_dp, "docs", "reading", "--path"], capture_output=True, text=True, env=env
    )
    assert where.stdout.strip().startswith(str(venv)), where.stdout
    copied = subprocess.run(
        [keras_dp, "notebook"], cwd=work, capture_output=True, text=True, env=env
    )
    assert copied.returncode == 0, copied.stderr
    notebook = (work / "report.ipynb").read_bytes()
    assert notebook == (REPO / "notebooks" / "report.ipynb").read_bytes()
