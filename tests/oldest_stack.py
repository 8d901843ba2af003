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
        print(f"quickstart: ran on TensorFlow {tf_version}, Keras {keras_version}")

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
