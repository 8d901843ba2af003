"""Step ``install``: make TensorFlow (with its CUDA wheels), pandas and the package
importable, from the project's own files only: ``constraints.txt`` and ``setup.cfg``'s
extras, from a wheelhouse folder when one is carried (``KDT_WHEELHOUSE``, default
``wheelhouse/`` in the checkout), else through pip and its cache. A machine without
network and without those wheels gets a clear "cannot install" and the check goes on
with the steps that need no TensorFlow."""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

from keras_dp_tools.tools.gpu_check.results import write_result

REPO = Path(__file__).resolve().parents[3]
WHEELHOUSE_ENV = "KDT_WHEELHOUSE"
NEEDED = ("tensorflow", "keras", "pandas", "pyarrow", "pytest")
_CHECK = (
    "import importlib, json; v = {}\n"
    "for name in {names!r}:\n"
    "    try: v[name] = getattr(importlib.import_module(name), '__version__', '?')\n"
    "    except Exception as e: v[name] = None\n"
    "print(json.dumps(v))"
)


def importable(python: str = sys.executable) -> dict[str, str | None]:
    """Each needed module's version, None where it does not import (a fresh process:
    a half-installed TensorFlow must not poison this one)."""
    import json

    names = (*NEEDED, "pynvml")
    try:
        output = subprocess.run(
            [python, "-c", _CHECK.format(names=names)],
            capture_output=True,
            text=True,
            timeout=90,
            check=True,
        ).stdout
        return json.loads(output.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return {name: None for name in names}


def wheelhouse() -> Path | None:
    folder = Path(os.environ.get(WHEELHOUSE_ENV) or REPO / "wheelhouse")
    return folder if folder.is_dir() else None


def pip_command(python: str = sys.executable) -> list[str]:
    command = [python, "-m", "pip", "install", "--quiet", "-c", str(REPO / "constraints.txt")]
    folder = wheelhouse()
    if folder is not None:
        command += ["--no-index", "--find-links", str(folder)]
    else:  # the pip cache may hold everything; without network fail fast, not retry
        command += ["--retries", "0", "--timeout", "5"]
    # and-cuda: the CUDA libraries (CUPTI too) as wheels, so no CUDA install is needed.
    return [*command, "tensorflow[and-cuda]", "-e", f"{REPO}[multiworker,dev]"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    command = pip_command()
    source = f"wheelhouse {wheelhouse()}" if wheelhouse() else "pip (cache, then network)"
    if args.dry_run:
        print(f"would check imports of {', '.join(NEEDED)}, and if one is missing run:")
        print(shlex.join(command))
        write_result(
            args.out,
            {"status": "dry-run", "summary": f"would install from {source} if needed"},
        )
        return 0
    before = importable()
    notes = [f"before: {before}"]
    if all(before[name] for name in NEEDED):
        summary, after = (
            "already installed: " + ", ".join(f"{name} {before[name]}" for name in NEEDED),
            before,
        )
    else:
        print("$", shlex.join(command), flush=True)
        pip = subprocess.run(command, capture_output=True, text=True)
        print(pip.stdout[-4000:], pip.stderr[-4000:], sep="\n", flush=True)
        tail = (pip.stderr.strip().splitlines() or ["(no output)"])[-1]
        notes.append(f"pip from {source}: exit {pip.returncode}: {tail}")
        after = importable()
        summary = f"installed from {source}"
    missing = [name for name in NEEDED if not after[name]]
    result = {
        "status": "ok" if not missing else "failed",
        "tensorflow": bool(after["tensorflow"] and after["pandas"]),
        "summary": summary
        if not missing
        else f"cannot install {', '.join(missing)} from {source}: only the steps that need "
        "no TensorFlow run",
        "notes": [*notes, f"after: {after}"],
    }
    if not after.get("pynvml"):
        result["notes"].append("pynvml (nvidia-ml-py) does not import: no NVML readings")
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
