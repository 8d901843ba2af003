"""Re-executes ``notebooks/report.ipynb`` in place, so that the outputs a code host shows
are those of a real run: ``make notebook``.

Without ``--log-dir`` it first trains the demo (``keras-dp demo``: 4 replicas, on logical
CPU devices when there is no GPU; about a minute) into a temporary folder, then runs every
cell against it with ``KERAS_DP_LOG_DIR`` set, as the notebook's reader would. A cell that
fails stops it and leaves the file as it was. The saved outputs name the log dir as
``<log_dir>``, the installed packages as ``<site-packages>``, Python as ``<python>``,
the checkout as ``.`` and the home folder as ``~`` rather than this machine's paths, and
carry no execution timestamps.

Needs the ``dev`` extras (``nbclient``, ``nbformat``, ``ipykernel``).

Example:

```bash
.venv/bin/python notebooks/regenerate.py                       # a fresh demo run
.venv/bin/python notebooks/regenerate.py --log-dir runs/my-run  # a run you have
```
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parent
NOTEBOOK = NOTEBOOKS / "report.ipynb"
REPOSITORY = NOTEBOOKS.parent
LOG_DIR_PLACEHOLDER = "<log_dir>"


def train_demo(log_dir: Path, replicas: int, steps: int) -> None:
    """``keras-dp demo`` in its own process (it splits the CPU into devices)."""
    command = [sys.executable, "-m", "keras_dp_tools", "demo", "--replicas", str(replicas)]
    command += ["--steps", str(steps), "--log-dir", str(log_dir)]
    print("training:", " ".join(command[1:]), flush=True)
    result = subprocess.run(command, cwd=REPOSITORY, capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"the demo failed ({result.returncode}):\n{result.stderr[-3000:]}")


def machine_paths(log_dir: Path) -> list[tuple[str, str]]:
    """This machine's folders an output may name (in a warning's file, a repr), each
    with what stands for it in the saved notebook; the longest first, so that a folder
    inside another (the venv inside the checkout) is replaced as the inner one."""
    import site
    import sysconfig

    pairs = [(str(log_dir.resolve()), LOG_DIR_PLACEHOLDER), (str(log_dir), LOG_DIR_PLACEHOLDER)]
    libraries = {*site.getsitepackages(), site.getusersitepackages()}
    libraries |= {sysconfig.get_paths()[name] for name in ("purelib", "platlib", "stdlib")}
    pairs += [(path, "<site-packages>") for path in libraries if "site-packages" in path]
    pairs += [(path, "<python-lib>") for path in libraries if "site-packages" not in path]
    pairs += [(sys.prefix, "<python>"), (sys.base_prefix, "<python>")]
    pairs += [(str(REPOSITORY), "."), (str(Path.home()), "~")]
    pairs = [(path, stand_in) for path, stand_in in pairs if len(path) > 1]  # never "/"
    return sorted(pairs, key=lambda pair: len(pair[0]), reverse=True)


def scrub(text: str, log_dir: Path) -> str:
    """The text with this machine's paths (the log dir, the Python installation and its
    packages, the checkout, the home folder) replaced by stand-ins."""
    for path, stand_in in machine_paths(log_dir):
        text = text.replace(path, stand_in)
    return text


def execute(log_dir: Path, timeout_s: int = 300) -> None:
    import nbclient
    import nbformat

    # The kernel runs in notebooks/: a log dir relative to where the command was started
    # (make notebook RUN=runs/x) would name another folder there.
    log_dir = Path(log_dir).resolve()
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        notebook,
        kernel_name="python3",
        timeout=timeout_s,
        record_timing=False,  # no execution timestamps in the saved file
        resources={"metadata": {"path": str(NOTEBOOKS)}},
    )
    previous = os.environ.get("KERAS_DP_LOG_DIR")
    os.environ["KERAS_DP_LOG_DIR"] = str(log_dir)
    try:
        client.execute()  # raises CellExecutionError on a failing cell
    finally:
        if previous is None:
            os.environ.pop("KERAS_DP_LOG_DIR")
        else:
            os.environ["KERAS_DP_LOG_DIR"] = previous
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            if "text" in output:
                output["text"] = scrub(output["text"], log_dir)
            for kind, value in output.get("data", {}).items():
                if kind.startswith("text/"):
                    output["data"][kind] = scrub(value, log_dir)
    nbformat.write(notebook, NOTEBOOK)
    size_kb = NOTEBOOK.stat().st_size / 1024
    print(f"wrote {NOTEBOOK.relative_to(REPOSITORY)} ({size_kb:.0f} KB)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--log-dir", type=Path, help="a recorded run (default: a fresh demo)")
    parser.add_argument("--replicas", type=int, default=4, help="demo replicas (4)")
    parser.add_argument("--steps", type=int, default=300, help="demo steps (300)")
    args = parser.parse_args(argv)
    if args.log_dir is not None:
        execute(args.log_dir)
        return 0
    with tempfile.TemporaryDirectory(prefix="kdt-notebook-") as folder:
        log_dir = Path(folder) / "demo"
        train_demo(log_dir, args.replicas, args.steps)
        execute(log_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
