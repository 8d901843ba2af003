"""Scores the advisor on the corpus's runs: does the first finding name the cause, and
does any finding give a wrong fix?

Reads the runs ``run_all.py`` wrote (``<out>/<name>/``, the cause-6 cases' two replica
counts together), loads each with ``kdt.Report.load`` and takes ``Report.advice()``.

* **First finding.** The first finding that is not a caveat (the advisor's
  ``CAVEAT_CODES``: the CPU saturation of replicas sharing cores is printed once above
  the findings, MANIFEST.md "Per-thread notes"). It names the cause when its code is
  one of that case's class in ``CAUSE_CODES``. A case with "(and N)" in its class
  accepts either class.
* **Wrong fix.** Any finding whose code ``WRONG_CODES`` lists for the case's class. The
  lists are MANIFEST.md's "Wrong:" bullets turned into finding codes.

Both tables were written from MANIFEST.md before the advisor was run on any case; the
codes that did not exist yet are those the issue asks for. One name was aligned with
its producer afterwards, before any run of the test half: the eager custom loop's
finding is ``eager-strategy-run`` (the table had ``eager-distributed-step``).

    PYTHONPATH=<checkout> python benchmarks/advisor_corpus/score.py OUT --half dev
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys
import warnings

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from run_all import names_in_half  # noqa: E402

from keras_dp_tools.analysis.advice import CAVEAT_CODES  # noqa: E402

# Finding codes that name each cause class (issue 36's list).
CAUSE_CODES = {
    1: {"too-little-work"},
    2: {"input-bound", "input-not-scaling"},
    3: {"time-outside-steps"},
    4: {"no-data-parallelism"},
    5: {"custom-loop-not-measured", "eager-strategy-run", "loop-host-sync"},
    6: {"slower-kernels"},
}

# Codes whose fix is wrong for a class (MANIFEST.md's "Wrong:" bullets):
# 1: input fixes, a scope error;  2: more work per step (a larger batch,
# steps_per_execution), a scope error;  3: input fixes, a scope error;  4: any batch
# change, input fixes,
# "too little work";  5: anything read from records a custom loop did not write, a scope
# error, batch or input fixes;  6: input fixes, "too little work" first (checked as a
# first-finding miss), a scope error.
# The batching check's codes that propose another batch size.
BATCH_CHANGE = {"missing-multiply", "batch-mismatch", "plan-mismatch"}
WRONG_CODES = {
    1: {"input-bound", "input-not-scaling", "no-data-parallelism"},
    2: {"too-little-work", "no-data-parallelism", *BATCH_CHANGE},
    3: {"input-bound", "input-not-scaling", "no-data-parallelism"},
    4: {"input-bound", "input-not-scaling", "too-little-work", *BATCH_CHANGE},
    5: {"input-bound", "no-data-parallelism", *BATCH_CHANGE},
    6: {"input-bound", "input-not-scaling", "no-data-parallelism"},
}
# Cases whose notes name a wrong fix beyond their class's: a batch already scaled
# (tensorflow#48374: multiplying again is wrong), batch changes for per-fit overheads.
WRONG_FOR_CASE = {
    "tf48374_mwms_mnist_tutorial": BATCH_CHANGE,
    "tf103564_kfold_fit_overheads": BATCH_CHANGE,
}


def manifest_cases() -> dict[str, dict]:
    """name -> {"classes": {..}, "half": ..} from MANIFEST.md's corpus table."""
    cases = {}
    for line in (HERE / "MANIFEST.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        names = re.findall(r"repro_(\w+)\.py", line)
        if len(cells) == 7 and names:
            classes = {int(number) for number in re.findall(r"\d", cells[3])}
            cases[names[0]] = {"classes": classes, "half": cells[6]}
    return cases


def score_case(name: str, case: dict, out: pathlib.Path) -> dict:
    import keras_dp_tools as kdt

    folder = out / name
    result = {"name": name, "classes": sorted(case["classes"]), "codes": [], "error": ""}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            advice = kdt.Report.load(folder).advice()
    except (FileNotFoundError, ValueError) as why:  # a custom loop wrote no records
        advice = []
        result["error"] = f"{type(why).__name__}: {str(why)[:120]}"
    codes = [item.code for item in advice]
    result["codes"] = codes
    first = next((code for code in codes if code not in CAVEAT_CODES), None)
    named = set().union(*(CAUSE_CODES[number] for number in case["classes"]))
    result["first"] = first
    result["names_cause"] = first in named
    wrong = set().union(*(WRONG_CODES[number] for number in case["classes"]))
    wrong |= WRONG_FOR_CASE.get(name, set())
    result["wrong"] = sorted(set(codes) & wrong)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=pathlib.Path, help="the folder run_all.py wrote")
    parser.add_argument("--half", choices=("dev", "test"), required=True)
    args = parser.parse_args(argv)
    cases = manifest_cases()
    names = names_in_half(args.half)
    results = [score_case(name, cases[name], args.out) for name in names]
    print("| case | class | first finding | names the cause | wrong fixes | all codes |")
    print("|---|---|---|---|---|---|")
    for r in results:
        classes = "/".join(str(number) for number in r["classes"])
        codes = ", ".join(r["codes"]) or (r["error"] or "none")
        print(
            f"| {r['name']} | {classes} | {r['first'] or '-'} | "
            f"{'yes' if r['names_cause'] else 'no'} | {', '.join(r['wrong']) or '-'} | {codes} |"
        )
    named = sum(r["names_cause"] for r in results)
    clean = sum(not r["wrong"] for r in results)
    print(
        f"\n{args.half} half: first finding names the cause in {named} of {len(results)} "
        f"({named / len(results):.0%}); no wrong fix in {clean} of {len(results)}."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
