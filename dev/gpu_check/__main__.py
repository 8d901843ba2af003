"""``python -m dev.gpu_check --out DIR [--dry-run] [--budget-s N]``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from dev.gpu_check import machine
from dev.gpu_check.report import write_report
from dev.gpu_check.runner import run_all
from dev.gpu_check.steps import STEPS

# Under the 8 minutes the check promises, with room to write the report and exit.
DEFAULT_BUDGET_S = 450.0


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m dev.gpu_check",
        description="Run the GPU paths on this machine's GPU and write OUT/REPORT.md.",
    )
    parser.add_argument("--out", type=Path, default=Path("gpu-check"), help="report folder")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print each step's command and run its CPU-dry form (no GPU needed)",
    )
    parser.add_argument(
        "--budget-s", type=float, default=DEFAULT_BUDGET_S, help="seconds for all steps"
    )
    parser.add_argument(
        "--steps",
        help=f"comma-separated subset of: {', '.join(step.name for step in STEPS)}",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    steps = STEPS
    if args.steps:
        wanted = [name.strip() for name in args.steps.split(",") if name.strip()]
        unknown = sorted(set(wanted) - {step.name for step in STEPS})
        if unknown:
            print(
                f"unknown step(s) {unknown}; choose from {[s.name for s in STEPS]}", file=sys.stderr
            )
            return 2
        steps = [step for step in STEPS if step.name in wanted]
    names, _ = machine.gpu_names()
    if not names and not args.dry_run:
        machine.main()  # says why, in one line
        return 0
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    facts = machine.facts(names)
    facts["budget"] = f"{args.budget_s:.0f} s" + (
        " (dry run: CPU forms only)" if args.dry_run else ""
    )

    def after_each(results: list[dict]) -> None:
        done = {result["step"] for result in results}
        pending = [step.name for step in steps if step.name not in done]
        state = "partial: running" if pending else "complete"
        write_report(out, results, pending, facts, state)
        last = results[-1]
        seconds, summary = last.get("seconds", 0), last.get("summary", "")
        print(f"[{last['step']}] {last['status']} ({seconds} s): {summary}")
        if args.dry_run:
            print(f"    would run: {last.get('command') or '(nothing)'}")
            print(f"    CPU-dry form: {last.get('dry_command') or '(none: printed only)'}")

    write_report(out, [], [step.name for step in steps], facts, "partial: starting")
    started = time.monotonic()
    run_all(steps, out, args.budget_s, sys.executable, args.dry_run, after_each)
    print(f"{out / 'REPORT.md'} written ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
