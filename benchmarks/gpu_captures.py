"""Our analysis beside XProf's on profiler captures made by others (benchmarks/gpu_captures.md).

Fetches nothing: give it a folder holding local copies of the captures (any layout; every
``*.xplane.pb`` under it is read). For each capture, each file is copied into a folder of
its own (XProf caches its answers by folder) and read by both tools:

* ours: ``kdt.analyze_trace`` (where the steps came from, the replicas and their devices,
  the devices listed apart, per-GPU compute and step time);
* XProf's ``input_pipeline_analyzer`` (``use_saved_result`` off): its steps, step time and
  device compute.

Prints a Markdown table (``--output`` also writes it) and exits 1 when a capture's step
time or compute differs from XProf's by more than ``--tolerance`` (5%) on a step both
list. XProf times a step without a host step marker (``_r``) by its device events
alone, so ours is then compared after removing the host time before the first and after
the last device event (``dispatch_ms``); its device compute with ours on one GPU,
or our mean over several.

Run: ``python benchmarks/gpu_captures.py FOLDER [--output PATH] [--tolerance 0.05]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

COLUMNS = (
    "capture",
    "step source",
    "steps (ours / XProf)",
    "replicas: devices",
    "apart",
    "step ms (ours / XProf)",
    "GPU compute ms (ours / XProf)",
    "worst difference",
)


def compare(trace: Path, tolerance: float) -> tuple[list[str], bool]:
    """One capture's row of the table, and whether it is within ``tolerance``."""
    import keras_dp_tools as kdt

    with tempfile.TemporaryDirectory() as folder:
        copy = Path(folder) / trace.name
        shutil.copyfile(trace, copy)
        breakdown = kdt.analyze_trace(copy, xprof=True)
    steps, replicas = breakdown.steps, breakdown.replicas
    devices = ", ".join(sorted(replicas["device"].dropna().unique()))
    apart = "; ".join(f"{row.device}: {row.did}" for row in breakdown.devices_apart.itertuples())
    if not replicas["device"].astype(str).str.contains("GPU").any():
        return [str(trace), str(breakdown.step_source), str(len(steps)), devices, apart or "-"] + [
            "CPU capture: XProf has no device time"
        ] * 3, True
    both = steps.dropna(subset=["xprof_step_ms"])
    # XProf's step of a host marker (``_r``) is the marker; without one, its device span.
    marked = breakdown.step_source in ("kdp_marker", "train_marker")
    ours_step = both["step_ms"] - (0 if marked else both["dispatch_ms"])
    compute = replicas.groupby("step")["compute_ms"]
    # XProf's device compute: one GPU's (seen on a 2-GPU capture), so our mean per GPU.
    ours_compute = compute.mean()
    ours_compute = ours_compute.reindex(both["step"]).to_numpy()
    worst = 0.0
    for ours, theirs in (
        (ours_step.to_numpy(), both["xprof_step_ms"].to_numpy()),
        (ours_compute, both["xprof_device_compute_ms"].to_numpy()),
    ):
        for a, b in zip(ours, theirs, strict=True):
            if b > 0:
                worst = max(worst, abs(a - b) / b)
    xprof_steps = len(both)
    row = [
        str(trace),
        str(breakdown.step_source),
        f"{len(steps)} / {xprof_steps}",
        f"{steps['replicas'].max() if len(steps) else 0}: {devices}",
        apart or "-",
        _pair(ours_step.median(), both["xprof_step_ms"].median()),
        _pair(
            float(ours_compute.mean()) if len(ours_compute) else float("nan"),
            both["xprof_device_compute_ms"].mean(),
        ),
        f"{worst:.1%}" if xprof_steps else "XProf lists no step",
    ]
    return row, bool(xprof_steps) and worst <= tolerance


def _pair(ours: float, theirs: float) -> str:
    return f"{ours:.3f} / {theirs:.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="local copies of the captures")
    parser.add_argument("--output", type=Path, default=None, help="also write the table here")
    parser.add_argument("--tolerance", type=float, default=0.05)
    args = parser.parse_args(argv)
    traces = sorted(args.folder.rglob("*.xplane.pb"))
    if not traces:
        print(f"no *.xplane.pb under {args.folder}", file=sys.stderr)
        return 1
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    within = True
    for trace in traces:
        try:
            row, ok = compare(trace, args.tolerance)
        except Exception as error:  # one unreadable capture is its own row
            row, ok = [str(trace), f"failed: {type(error).__name__}: {error}"], False
            row += [""] * (len(COLUMNS) - len(row))
        within &= ok
        lines.append("| " + " | ".join(row) + " |")
    table = "\n".join(lines)
    print(table)
    if args.output:
        args.output.write_text(table + "\n")
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
