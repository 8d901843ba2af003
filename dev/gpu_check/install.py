"""Step ``install``: make TensorFlow (with its CUDA wheels), pandas and the package
importable, from the project's own files only: ``constraints.txt`` and ``setup.cfg``'s
extras, from a wheelhouse folder when one is carried (``KDT_WHEELHOUSE``, default
``wheelhouse/`` in the checkout), else through pip and its cache. A machine without
network and without those wheels gets a clear "cannot install" and the check goes on
with the steps that need no TensorFlow."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from dev.gpu_check.results import step_parser, write_result

REPO = Path(__file__).resolve().parents[2]
WHEELHOUSE_ENV = "KDT_WHEELHOUSE"
NEEDED = ("tensorflow", "keras", "pandas", "pyarrow", "pytest")
# Run in a fresh process, names in argv: each module's version, or null if it fails.
_CHECK = (
    "import importlib, json, sys\n"
    "def version(name):\n"
    "    try:\n"
    "        return str(getattr(importlib.import_module(name), '__version__', '?'))\n"
    "    except Exception:\n"
    "        return None\n"
    "print(json.dumps({name: version(name) for name in sys.argv[1:]}))\n"
)


def importable(python: str = sys.executable) -> dict[str, str | None]:
    """Each needed module's version, None where it does not import (a fresh process:
    a half-installed TensorFlow must not poison this one).

    Raises:
        subprocess.SubprocessError: the probe itself failed (its stderr says why).
    """
    names = (*NEEDED, "pynvml")
    probe = subprocess.run(
        [python, "-c", _CHECK, *names], capture_output=True, text=True, timeout=120
    )
    if probe.returncode != 0:
        raise subprocess.SubprocessError(f"import probe failed: {probe.stderr.strip()[-500:]}")
    return json.loads(probe.stdout.strip().splitlines()[-1])


def own_environment_refusal() -> str | None:
    """Why pip must not install here, or None when this is the checkout's own ``.venv``
    (what ``make gpu-check`` makes): installing into any other environment would change
    one that the user, or other checkouts, rely on."""
    expected = (REPO / ".venv").resolve()
    if Path(sys.prefix).resolve() == expected:
        return None
    return f"not installing into {sys.prefix}: only into {expected}, which make gpu-check makes"


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


def install(command: list[str], source: str) -> str:
    """Runs pip; returns a note with its exit status and last line."""
    print("$", shlex.join(command), flush=True)
    pip = subprocess.run(command, capture_output=True, text=True)
    print(pip.stdout[-4000:], pip.stderr[-4000:], sep="\n", flush=True)
    tail = (pip.stderr.strip().splitlines() or ["(no output)"])[-1]
    return f"pip from {source}: exit {pip.returncode}: {tail}"


def main(argv: list[str] | None = None) -> int:
    parser = step_parser(__doc__)
    args = parser.parse_args(argv)
    command = pip_command()
    source = f"wheelhouse {wheelhouse()}" if wheelhouse() else "pip (cache, then network)"
    refusal = own_environment_refusal()
    if args.dry_run:
        print(f"would check imports of {', '.join(NEEDED)}, and if one is missing run:")
        print(shlex.join(command))
        if refusal:
            print(f"(here it would not: {refusal})")
        summary = f"would install from {source} if needed" + (f"; {refusal}" if refusal else "")
        write_result(args.out, {"status": "dry-run", "summary": summary})
        return 0
    before = importable()
    notes = [f"before: {before}"]
    after = before
    if all(before[name] for name in NEEDED):
        summary = "already installed: " + ", ".join(f"{n} {before[n]}" for n in NEEDED)
    elif refusal:
        summary, source = refusal, "nowhere"
    else:
        notes.append(install(command, source))
        after = importable()
        summary = f"installed from {source}"
    missing = [name for name in NEEDED if not after[name]]
    if missing:
        summary = (
            f"missing {', '.join(missing)} ({summary}): only the steps that need no TensorFlow run"
        )
    notes.append(f"after: {after}")
    if not after.get("pynvml"):
        notes.append("pynvml (nvidia-ml-py) does not import: no NVML readings")
    write_result(
        args.out,
        {
            "status": "failed" if missing else "ok",
            "tensorflow": bool(after["tensorflow"] and after["pandas"]),
            "summary": summary,
            "notes": notes,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
