"""What a pip user of the oldest admitted stack meets (``make test-oldest``).

Run with the Python of a virtual environment where this checkout was installed
(``pip install -c constraints-oldest.txt .``): in an empty folder, with no ``PYTHONPATH``,
the README quickstart, ``keras-dp demo`` and ``keras-dp report`` run from the installed
package. Exits 1 with what failed, else prints one line per check.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.helpers.doc_blocks: standard library only

from tests.helpers.doc_blocks import python_block  # noqa: E402

BIN = Path(sys.executable).parent


def run(command: list[str], work: Path, what: str) -> str:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    done = subprocess.run(command, cwd=work, capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0:
        sys.exit(
            f"{what} failed (exit {done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
    return done.stdout


READ_STEPS = "import sys, keras_dp_tools as kdt; print(*kdt.Report.load(sys.argv[1]).steps.step)"


def shipped(work: Path) -> None:
    """What the package's output refers to is installed: the version, the dashboard's
    static files, the docs' pages (`keras-dp docs`) and the notebook (`keras-dp notebook`)."""
    keras_dp = str(BIN / "keras-dp")
    version = run([keras_dp, "--version"], work, "keras-dp --version").strip()
    expected = (REPO / "keras_dp_tools" / "__init__.py").read_text()
    if f'__version__ = "{version}"' not in expected:
        sys.exit(f"keras-dp --version says {version!r}, not the checkout's version")
    static = list(
        Path(sys.prefix).glob(
            "lib/python*/site-packages/keras_dp_tools/report/tensorboard_plugin/static"
        )
    )
    if not static or not {"index.js", "style.css"} <= {path.name for path in static[0].iterdir()}:
        sys.exit(f"the dashboard's static files are not installed: {static}")
    page = run([keras_dp, "docs", "reading"], work, "keras-dp docs reading")
    if page != (REPO / "docs" / "reading.md").read_text():
        sys.exit("keras-dp docs reading does not print docs/reading.md")
    where = run([keras_dp, "docs", "reading", "--path"], work, "keras-dp docs --path").strip()
    if not where.startswith(sys.prefix):
        sys.exit(f"keras-dp docs reads {where}, not the installed copy")
    run([keras_dp, "notebook"], work, "keras-dp notebook")
    if (work / "report.ipynb").read_bytes() != (REPO / "notebooks" / "report.ipynb").read_bytes():
        sys.exit("keras-dp notebook wrote something else than notebooks/report.ipynb")
    print("shipped: version, dashboard files, docs pages and the notebook are installed")


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="kdt-oldest-") as folder:
        work = Path(folder)
        code = "import keras, keras_dp_tools, tensorflow\n"
        code += "print(keras_dp_tools.__file__, tensorflow.__version__, keras.__version__)\n"
        code += python_block("README.md", "## Quickstart")
        out = run([sys.executable, "-c", code], work, "the README quickstart")
        imported_from, tf_version, keras_version = out.splitlines()[0].split()
        if not imported_from.startswith(sys.prefix):
            sys.exit(f"imported {imported_from}, not the package installed in {sys.prefix}")
        if "Summary of run" not in out or "Advice:" not in out:
            sys.exit(f"the quickstart printed no summary:\n{out[-2000:]}")
        steps = run(
            [sys.executable, "-c", READ_STEPS, str(work / "runs" / "quickstart")],
            work,
            "Report.load",
        )
        if steps.split() != [str(step) for step in range(40)]:
            sys.exit(f"the quickstart recorded steps {steps.split()}, not 0-39")
        print(f"quickstart: ran on TensorFlow {tf_version}, Keras {keras_version}")
        shipped(work)

        demo = work / "demo"
        args = ["--replicas", "2", "--steps", "40", "--epochs", "1", "--log-dir", str(demo)]
        out = run([str(BIN / "keras-dp"), "demo", *args], work, "keras-dp demo")
        if "Median step time" not in out:
            sys.exit(f"the demo printed no summary:\n{out[-2000:]}")
        print("demo: trained and summarised")

        out = run([str(BIN / "keras-dp"), "report", str(demo)], work, "keras-dp report")
        if "Replicas" not in out or "Compute" not in out:
            sys.exit(f"the report has no breakdown:\n{out[-2000:]}")
        print("report: summary with the breakdown")


if __name__ == "__main__":
    main()
