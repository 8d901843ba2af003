"""The ``keras-dp`` command (also ``python -m keras_dp_tools``)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

import keras_dp_tools
from keras_dp_tools.records.contract import LOG_DIR_ENV, REPLICAS_ENV, RUN_ID_ENV, TRACE_SUFFIX

EXIT_FAILURE = 1  # a runtime failure: a missing log dir, no records, an unreadable trace
EXIT_USAGE = 2  # a usage error: argparse's own, or options that do not go together
EXIT_STATUSES = (
    "Exit status: 0 success, 1 a runtime failure (a missing log dir, no records, an "
    "unreadable trace), 2 a usage error (a bad option, options that do not go together)."
)
OUTPUT_FORMATS = ("text", "json", "csv")
# keras-dp lint --format csv: the json's fields but ``related`` (a list: no CSV cell).
LINT_CSV_FIELDS = ("path", "line", "col", "cell", "code", "severity", "message")


class UsageError(Exception):
    """Options that parse but do not go together: exit status 2, as argparse's errors."""


def add_log_dir_option(parser: argparse.ArgumentParser, help: str) -> None:
    """``--log-dir``, also spelt ``--logdir`` as TensorBoard spells it."""
    parser.add_argument("--log-dir", "--logdir", dest="log_dir", type=Path, default=None, help=help)


def add_format_option(parser: argparse.ArgumentParser, help: str) -> None:
    """``--format text|json|csv`` (text by default); ``help`` says what each prints."""
    parser.add_argument("--format", choices=OUTPUT_FORMATS, default="text", help=help)


def positive_int(text: str) -> int:
    """argparse type: ``text`` as an int >= 1, else an ``ArgumentTypeError`` naming it."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a positive integer, received {text!r}"
        ) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, received {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The ``keras-dp`` parser: one subcommand per ``HANDLERS`` entry."""
    parser = argparse.ArgumentParser(
        prog="keras-dp",
        description="Profile and tune data-parallel Keras training.",
        epilog=f"{EXIT_STATUSES} Some commands add their own: see each one's --help.",
    )
    parser.add_argument("--version", action="version", version=keras_dp_tools.__version__)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser(
        "demo",
        help="train a small CNN data-parallel on synthetic data and record it",
        description="Train a small CNN with MirroredStrategy on synthetic images (GPUs if "
        "present, else the CPU split into logical devices), with keras_dp_tools callbacks, "
        "then print a summary and where to look next.",
    )
    demo.add_argument(
        "--replicas",
        type=positive_int,
        default=None,
        help="replicas: GPUs to use, or logical CPU devices without GPUs "
        f"(default: all GPUs, or {REPLICAS_ENV}, or 4 CPU devices)",
    )
    demo.add_argument("--steps", type=positive_int, default=300, help="training steps (300)")
    demo.add_argument("--epochs", type=positive_int, default=3, help="epochs (3)")
    demo.add_argument(
        "--per-replica-batch", type=positive_int, default=16, help="examples per replica (16)"
    )
    add_log_dir_option(demo, "run folder (runs/demo-<timestamp>)")

    analyze = commands.add_parser(
        "analyze",
        help="break profiled steps down into compute, all-reduce, sync wait and input",
        description=f"Read profiler traces (a {TRACE_SUFFIX}, or every one under a log dir) and "
        "print the per-step breakdown averaged over replicas. Any TensorFlow capture "
        "works: steps come from keras_dp_tools' markers, else tf_keras's or Keras 3's "
        "(TensorBoard profile_batch), else XProf's step grouping, else the whole capture "
        "(the step_source column says which). Under a log dir written by keras_dp_tools, "
        "the records supply replica count, devices and gradient bytes; otherwise give "
        "them with the options below (what stays unknown is said on stderr). "
        f"{EXIT_STATUSES}",
    )
    analyze.add_argument("source", type=Path, help=f"a {TRACE_SUFFIX} file or a log dir")
    add_format_option(
        analyze,
        "text: a table (default); json: an array of the rows, one object each; csv: the "
        "rows with a header line",
    )
    analyze.add_argument(
        "--csv",
        dest="format",
        action="store_const",
        const="csv",
        default=argparse.SUPPRESS,  # --format's default stands
        help="the same as --format csv",
    )
    analyze.add_argument("--per-replica", action="store_true", help="one row per step and replica")
    analyze.add_argument(
        "--jobs",
        type=positive_int,
        default=None,
        help="traces analysed at once, each in a process of its own (default: the cores "
        "this process may use; 1: one after the other, here)",
    )
    analyze.add_argument(
        "--allreduce-bytes",
        type=positive_int,
        default=None,
        help="bytes all-reduced per step (the gradients), for bandwidths, when the "
        "records do not say",
    )
    analyze.add_argument(
        "--replicas-in-sync",
        type=positive_int,
        default=None,
        help="ranks of each all-reduce over all workers (num_replicas_in_sync), for the "
        "bus bandwidth, when the records do not say (default: the trace's replicas)",
    )
    analyze.add_argument(
        "--devices",
        default=None,
        help="the replicas' devices, comma-separated in the strategy's order (e.g. "
        "/gpu:0,/gpu:1), when the records do not say; on GPU traces they choose the "
        "planes (default: every GPU that ran the model's kernels)",
    )

    lint = commands.add_parser(
        "lint",
        help="find batch sizes not scaled by the replica count (static, flake8-style)",
        description="Check Python files and notebooks for batch sizes that a "
        "tf.distribute strategy splits (they reach what it distributes, or run after it "
        "exists) and that are not derived from num_replicas_in_sync (KDP001; followed "
        "through helper functions and imports of project files; per-replica contracts "
        "such as distribute_datasets_from_function and values the code states are "
        "global are not reported: keras-dp docs scaling), constant "
        "batch_size given to fit/evaluate/predict, the global batch (KDP003), and "
        "constant learning rates next to scaled batches (KDP002). Parses only: never "
        "imports or runs the code. '# noqa: KDP001' silences a line. Exit status: 0 "
        "clean, 1 findings, 2 usage error (bad option, missing path, unreadable notebook: "
        "1 stays for findings alone).",
    )
    lint.add_argument("paths", nargs="+", type=Path, help="files or folders (.py, .ipynb)")
    lint.add_argument("--ignore", default="", help="comma-separated codes to skip, e.g. KDP002")
    lint.add_argument(
        "--exit-zero", action="store_true", help="exit 0 even when there are findings"
    )
    add_format_option(
        lint,
        "text: flake8-style lines (default); json: one array of findings, each with "
        "path, line, col, cell, code, severity, message and related places; csv: one row "
        f"per finding with {', '.join(LINT_CSV_FIELDS)}",
    )

    report = commands.add_parser(
        "report",
        help="print a run's summary and advice (optionally an HTML page with plots)",
        description="Load the records under LOG_DIR (all runs and workers) and print the "
        "summary, the scaling table when runs differ in replicas, and the advice; then "
        "each strategy comparison recorded under LOG_DIR (strategy_comparison.json of "
        "compare-strategies), also when it is all the log dir holds. "
        f"{EXIT_STATUSES} --html on a run with no steps yet (and no comparison) is a "
        "runtime failure (1).",
    )
    report.add_argument("log_dir", type=Path, help="a log dir (searched recursively)")
    report.add_argument("--html", type=Path, default=None, help="also write this HTML page")
    report.add_argument(
        "--merge-runs",
        action="append",
        default=None,
        metavar="detected|RUN,RUN[,...]",
        help="merge runs that are one job's workers recorded under separate run ids "
        "(records of workers that did not agree on one): 'detected' merges those the "
        "report finds (same cluster, disjoint workers, overlapping times; the text names "
        "them), or give the run ids of one job, comma-separated (repeat for more jobs)",
    )
    report.add_argument(
        "--trials",
        action="store_true",
        help="also the candidates' short runs of each strategy comparison under LOG_DIR "
        "(left out by default: they are the comparison's evidence, not your training)",
    )
    add_format_option(
        report,
        "text: the summary, scaling table and advice for people (default); json: an "
        'object with "summary" (one object per run) and "advice" (the findings); csv: '
        "the summary, one row per run (strategy comparisons alone: a row per candidate, "
        "with the comparison's folder under LOG_DIR in 'where')",
    )

    sweep = commands.add_parser(
        "sweep",
        help="run a training script once per replica count and compare",
        description="Run SCRIPT (a .py file, or 'demo') once per replica count with "
        f"{REPLICAS_ENV}, {LOG_DIR_ENV}=<log dir>/replicas-<N> and, with GPUs, "
        "CUDA_VISIBLE_DEVICES set; '{replicas}' and '{log_dir}' in the script arguments "
        "are replaced. Then print the scaling table and save scaling.png.",
    )
    sweep.add_argument("script", help="path of a training script, or 'demo'")
    sweep.add_argument(
        "--replicas", type=replica_list, required=True, help="comma-separated, e.g. 1,2,4"
    )
    add_log_dir_option(sweep, "sweep folder (runs/sweep-<timestamp>)")
    sweep.add_argument("script_args", nargs="*", help="after --: the script's own arguments")

    doctor = commands.add_parser(
        "doctor",
        help="print what the toolkit sees: devices, NVML, nvidia-smi, CUPTI",
        description="Check this machine for data-parallel profiling: TensorFlow's devices "
        "(or that TensorFlow is absent), NVML's version and each GPU's GPM and NVLink "
        "support, NVML readings next to nvidia-smi's, and whether the profiler records "
        "GPU activity (CUPTI), by profiling one matmul on the first GPU.",
    )
    doctor.add_argument(
        "--no-profile", action="store_true", help="skip the profiled matmul (CUPTI check)"
    )
    doctor.add_argument(
        "--check",
        action="store_true",
        help="exit 1 unless every check a GPU machine should pass passes "
        "(keras-dp docs gpu_monitor)",
    )
    launch = commands.add_parser(
        "launch",
        help="start the workers of a MultiWorkerMirroredStrategy job (TF_CONFIG each)",
        description="Run COMMAND once per worker with its own TF_CONFIG and one "
        f"{RUN_ID_ENV} for the job: --workers N starts N workers on this machine on free "
        "loopback ports; --host-list names every worker's host[:port] (2222 by default) "
        "and starts the ones on this machine (run the same command on each host). Output "
        "is prefixed with [worker i]; when a worker fails the others are stopped and the "
        "exit status is the failed worker's (128 + signal when it was killed); 2 for a "
        "usage error (no command, --workers and --host-list missing or disagreeing), 1 "
        "when the launcher itself fails (e.g. no worker of --host-list on this machine).",
    )
    launch.add_argument("--workers", type=positive_int, default=None, help="local workers")
    launch.add_argument(
        "--host-list", default=None, help="comma-separated host[:port] of every worker"
    )
    launch.add_argument(
        "--run-id", default=None, help=f"the job's run id ({RUN_ID_ENV}; default: new)"
    )
    add_log_dir_option(
        launch,
        f"the job's log dir: given to the workers as {LOG_DIR_ENV}, and where the "
        "launcher records how each worker ended (keras_dp/launcher.jsonl)",
    )
    launch.add_argument(
        "--grace",
        type=float,
        default=10.0,
        help="seconds a stopped worker gets to exit after SIGINT before SIGKILL (10)",
    )
    launch.add_argument(
        "script_args", nargs="*", help="after --: the command, e.g. python train.py"
    )
    tune = commands.add_parser(
        "tune-allreduce",
        help="measure each all-reduce implementation on your model and pick one",
        description="Import SCRIPT in one process per candidate cross-device implementation "
        "(MirroredStrategy's collective default, packings, ReductionToOneDevice, NCCL and "
        "hierarchical copy on GPUs), train its build_model() on make_dataset(global_batch) "
        "in interleaved rounds, and print the table, the decision (the fastest only when it "
        "wins by more than the rounds' spread, else MirroredStrategy's default) and the code "
        "that builds it. See keras-dp docs tuning.",
    )
    tune.add_argument("script", type=Path, help="a .py file with build_model and make_dataset")
    tune.add_argument(
        "--replicas", type=positive_int, default=None, help="GPUs, or logical CPU devices"
    )
    tune.add_argument(
        "--per-replica-batch", type=positive_int, default=32, help="examples per replica (32)"
    )
    tune.add_argument("--steps", type=positive_int, default=20, help="timed steps each (20)")
    tune.add_argument("--rounds", type=positive_int, default=3, help="interleaved rounds (3)")
    tune.add_argument("--candidates", default=None, help="comma-separated names (default: all)")
    add_log_dir_option(tune, "keep records and logs here")
    compare = commands.add_parser(
        "compare-strategies",
        help="train your model under each distribution strategy and say which is fastest",
        description="Import SCRIPT in the processes of each candidate strategy (one device, "
        "MirroredStrategy, CentralStorageStrategy, MultiWorkerMirroredStrategy with local "
        "workers, ParameterServerStrategy with a local cluster), train its build_model() on "
        "make_dataset(global_batch) at the same per-replica batch in interleaved rounds, and "
        "print the table, the verdict and the code that builds the winner. Exit status 1 "
        "when no candidate was measured. See keras-dp docs strategies.",
    )
    compare.add_argument("script", type=Path, help="a .py file with build_model and make_dataset")
    compare.add_argument(
        "--strategies", default=None, help="comma-separated candidate names (default: all)"
    )
    compare.add_argument(
        "--per-replica-batch", type=positive_int, default=32, help="examples per replica (32)"
    )
    compare.add_argument("--steps", type=positive_int, default=30, help="timed steps each (30)")
    compare.add_argument("--rounds", type=positive_int, default=3, help="interleaved rounds (3)")
    compare.add_argument(
        "--timeout",
        type=positive_int,
        default=600,
        help="seconds a candidate may take to start, profile or run one round (600)",
    )
    compare.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="CANDIDATE.KEY=VALUE",
        help="a candidate's option, e.g. multi_worker_mirrored.workers=2 (repeatable)",
    )
    add_log_dir_option(compare, "keep records, logs and strategy_comparison.json here")
    add_format_option(
        compare, "text: table, verdict and code; json: the comparison record; csv: the table"
    )
    docs = commands.add_parser(
        "docs",
        help="print a page of the documentation (the pages the output refers to)",
        description="Print the page of TOPIC from the documentation installed with the "
        "package (the docs folder in a checkout), e.g. keras-dp docs reading; without "
        "TOPIC, list the topics with their titles.",
    )
    docs.add_argument("topic", nargs="?", default=None, help="a page, e.g. reading")
    docs.add_argument(
        "--path", action="store_true", help="print the page's file path instead of its text"
    )
    notebook = commands.add_parser(
        "notebook",
        help="write a copy of the report notebook (a tutorial that loads your run)",
        description="Write a copy of the report notebook installed with the package to DEST "
        "(a file, or a folder to hold report.ipynb; default: report.ipynb here), to open "
        f"in Jupyter with {LOG_DIR_ENV} set to a run's log dir (an absolute path: the "
        "kernel runs in the notebook's folder).",
    )
    notebook.add_argument("dest", nargs="?", type=Path, default=Path("report.ipynb"))
    notebook.add_argument("--force", action="store_true", help="replace DEST if it exists")
    return parser


def replica_list(text: str) -> list[int]:
    """argparse type: ``"1,2,4"`` as sorted distinct replica counts (``--replicas``)."""
    try:
        counts = [positive_int(part.strip()) for part in text.split(",") if part.strip()]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected positive integers separated by commas, received {text!r}"
        ) from None
    if not counts:
        raise argparse.ArgumentTypeError(f"expected at least one replica count, received {text!r}")
    return sorted(set(counts))


def run_demo_command(args: argparse.Namespace) -> int:
    """``keras-dp demo`` with the parsed ``args``; returns the exit status."""
    # TensorFlow's C++ info lines (CUDA probing on a CPU machine) bury the demo's output.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from keras_dp_tools.tools import demo

    if args.steps < args.epochs:  # found before TensorFlow starts, and named as options
        raise UsageError(f"--steps ({args.steps}) must be at least --epochs ({args.epochs}).")
    log_dir = args.log_dir or demo.default_log_dir()
    report = demo.run_demo(
        replicas=args.replicas,
        steps=args.steps,
        epochs=args.epochs,
        per_replica_batch=args.per_replica_batch,
        log_dir=log_dir,
    )
    demo.print_next_steps(report, log_dir)
    return 0


def merge_runs_option(values: list[str] | None):
    """``--merge-runs`` as ``Report.load``'s ``merge_runs``: None, ``"detected"``, or
    groups of run ids."""
    if not values:
        return None
    if values == ["detected"]:
        return "detected"
    groups = [[run.strip() for run in value.split(",") if run.strip()] for value in values]
    if any(len(group) < 2 for group in groups):
        raise UsageError(
            "--merge-runs takes 'detected' alone, or two or more run ids separated by "
            f"commas per use (one job each), received {values!r}."
        )
    return groups


def run_report_command(args: argparse.Namespace) -> int:
    """``keras-dp report`` with the parsed ``args``; returns the exit status."""
    from keras_dp_tools.analysis.jobs import MergeRunsError
    from keras_dp_tools.report.comparison import load_comparisons

    errors = []  # a broken comparison record must hide neither the runs nor the others
    comparisons = load_comparisons(args.log_dir, errors=errors)
    for error in errors:
        print(f"keras-dp report: strategy comparison left out: {error}", file=sys.stderr)
    try:
        report = keras_dp_tools.Report.load(
            args.log_dir, merge_runs=merge_runs_option(args.merge_runs), trials=args.trials
        )
    except MergeRunsError as error:  # runs named that cannot be merged: bad input
        raise UsageError(f"--merge-runs: {error}") from None
    except FileNotFoundError:
        if not comparisons:
            raise
        report = None  # a strategy comparison alone: it is the report
    if args.format == "json":
        print(json.dumps(_report_data(report, comparisons), indent=2))
    elif args.format == "csv":  # as Report.to_csv writes summary.csv
        if report is not None:
            report.summary(advice=False).reset_index().to_csv(sys.stdout, index=False)
            if comparisons:  # another table: not in this CSV, but not in silence
                where = ", ".join(found.where or "." for found in comparisons)
                print(
                    f"keras-dp report: the strategy comparisons under {args.log_dir} "
                    f"({where}) are not in the CSV of the runs' summary; --format json "
                    "holds them, or `keras-dp report` on a folder with only comparisons",
                    file=sys.stderr,
                )
        else:  # one table: a row per candidate of each comparison, and where it is
            import pandas as pd

            tables = [found.table.assign(where=found.where) for found in comparisons]
            _comparison_csv(pd.concat(tables, ignore_index=True), first=("where",))
    else:
        print(report.text() if report is not None else "No training records.")
        for found in comparisons:
            print(f"\n{found.title}\n\n{_strategy_comparison(found)}")
        if comparisons and not args.trials:
            print("\n(The candidates' own short runs are left out: --trials shows them.)")
    if not args.html:
        return 0
    if report is not None and report.steps.empty:
        if not comparisons:
            print(
                f"keras-dp report: no HTML report written: the records under {args.log_dir} "
                "hold no training steps yet (is the run still starting, or did it stop "
                "before its first step?)",
                file=sys.stderr,
            )
            return EXIT_FAILURE
        report = None  # the page shows the comparison alone
    from keras_dp_tools.report.html import write_html

    # On stdout only beside the text: JSON or CSV there stay parseable.
    page = write_html(report, args.html, comparisons=comparisons)
    print(f"\nHTML report: {page}", file=_text_stream(args))
    return 0


def _strategy_comparison(found):
    """A recorded comparison as ``compare_strategies`` returns it (its text, its table)."""
    from keras_dp_tools.tools.strategies.compare import StrategyComparison

    return StrategyComparison.from_record(found.record, found.log_dir, table=found.table)


def _comparison_csv(table, first: tuple[str, ...] = ()) -> None:
    """``compare-strategies --format csv``: the table's numbers, a row per candidate
    (after the columns ``first``)."""
    from keras_dp_tools.tools.strategies.compare import SHOWN_COLUMNS

    table[[*first, "label", *SHOWN_COLUMNS, "reason"]].to_csv(sys.stdout, index=False)


def _report_data(report, comparisons) -> dict:
    """``report --format json``: the summary's rows (JSON's null for what is unknown),
    the advice's findings, and the strategy comparisons' records."""
    if report is None:
        summary, advice = [], []
    else:
        summary = report.summary(advice=False).reset_index()
        summary = json.loads(summary.to_json(orient="records"))
        advice = [finding.to_dict() for finding in report.advice()]
    return {
        "summary": summary,
        "advice": advice,
        "strategy_comparisons": [found.record for found in comparisons],
    }


def _text_stream(args: argparse.Namespace):
    """Where lines for people go: stdout beside text output, else stderr."""
    return sys.stdout if args.format == "text" else sys.stderr


def run_sweep_command(args: argparse.Namespace) -> int:
    """``keras-dp sweep`` with the parsed ``args``; returns the exit status."""
    import time

    from keras_dp_tools.report import plots
    from keras_dp_tools.tools.sweep import run_sweep

    log_dir = args.log_dir or Path("runs") / f"sweep-{time.strftime('%Y%m%d-%H%M%S')}"
    script_args = args.script_args
    print(f"Sweep of {args.script} over {args.replicas} replicas into {log_dir}", flush=True)
    report = run_sweep(
        args.script,
        args.replicas,
        log_dir,
        script_args,
        progress=lambda line: print(line, flush=True),
    )
    print()
    print(report.text())
    figure_path = log_dir / "scaling.png"
    plots.scaling(report).savefig(figure_path, dpi=100)
    print(f"\nScaling plot: {figure_path}\nMore: keras-dp report {log_dir} --html report.html")
    return 0


def run_launch_command(args: argparse.Namespace) -> int:
    """``keras-dp launch`` with the parsed ``args``; returns the job's exit status."""
    from keras_dp_tools.tools.launch import cluster_addresses, launch

    if not args.script_args:
        raise UsageError(
            "no command to launch: put it after '--', e.g. keras-dp launch --workers 2 -- "
            "python train.py"
        )
    try:
        addresses = cluster_addresses(args.workers, args.host_list)
    except ValueError as error:  # --workers and --host-list missing or disagreeing
        raise UsageError(str(error)) from None
    return launch(
        args.script_args, addresses, run_id=args.run_id, log_dir=args.log_dir, grace_s=args.grace
    )


def run_tune_allreduce_command(args: argparse.Namespace) -> int:
    """``keras-dp tune-allreduce`` with the parsed ``args``; returns the exit status."""
    from keras_dp_tools.tools.tuning.allreduce import tune_allreduce

    script = _script_path(args.script)
    candidates = args.candidates.split(",") if args.candidates else None
    result = tune_allreduce(
        f"{script}:build_model",
        f"{script}:make_dataset",
        devices=args.replicas,
        steps=args.steps,
        rounds=args.rounds,
        per_replica_batch=args.per_replica_batch,
        candidates=[name.strip() for name in candidates] if candidates else None,
        log_dir=args.log_dir,
        progress=lambda line: print(line, flush=True),
    )
    print()
    print(result)
    return 0 if result.best else 1


def candidate_options(settings: list[str]) -> dict[str, dict]:
    """``--option CANDIDATE.KEY=VALUE`` settings as ``compare_strategies``' options; a
    VALUE that reads as JSON (``2``, ``true``, ``{...}``) is taken as such, else as text."""
    options: dict[str, dict] = {}
    for setting in settings:
        target, equals, text = setting.partition("=")
        candidate, dot, key = target.partition(".")
        if not (equals and dot and candidate and key):
            raise UsageError(
                f"--option CANDIDATE.KEY=VALUE, e.g. multi_worker_mirrored.workers=2; "
                f"received {setting!r}."
            )
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        options.setdefault(candidate.strip(), {})[key.strip()] = value
    return options


def run_compare_strategies_command(args: argparse.Namespace) -> int:
    """``keras-dp compare-strategies`` with the parsed ``args``; returns the exit status."""
    from keras_dp_tools.tools.strategies.compare import (
        ComparisonArgumentError,
        compare_strategies,
    )

    script = _script_path(args.script)
    names = None if args.strategies is None else args.strategies.split(",")
    lines = _text_stream(args)
    try:
        result = compare_strategies(
            f"{script}:build_model",
            f"{script}:make_dataset",
            names,
            per_replica_batch=args.per_replica_batch,
            steps=args.steps,
            rounds=args.rounds,
            options=candidate_options(args.option),
            log_dir=args.log_dir,
            timeout=args.timeout,
            progress=lambda line: print(line, file=lines, flush=True),
        )
    except ComparisonArgumentError as error:  # the API's checks are the command's
        raise UsageError(str(error)) from None
    if args.format == "json":
        print(json.dumps(result.record, indent=2))
    elif args.format == "csv":
        _comparison_csv(result.table)
    else:
        print()
        print(result)
    return 0 if result.best else EXIT_FAILURE


def _script_path(script: Path) -> Path:
    if not script.is_file() or script.suffix != ".py":
        raise UsageError(f"Expected a .py script, received {script}.")
    return script.resolve()


def run_lint_command(args: argparse.Namespace) -> int:
    """``keras-dp lint`` with the parsed ``args``; returns the exit status (1: findings)."""
    import csv

    from keras_dp_tools.checks.lint import Summary, lint_paths

    ignore = [code.strip() for code in args.ignore.split(",") if code.strip()]
    reports = []
    summary = Summary()
    try:
        for report in lint_paths(args.paths, ignore=ignore, summary=summary):
            if args.format == "text":
                print(report, flush=True)
            reports.append(report)
    except (OSError, ValueError) as error:
        # A path or notebook lint cannot read: a usage error, as 1 means findings.
        raise UsageError(str(error)) from None
    if args.format == "json":
        print(json.dumps([report.to_dict() for report in reports], indent=2))
    elif args.format == "csv":
        writer = csv.DictWriter(
            sys.stdout, LINT_CSV_FIELDS, extrasaction="ignore", lineterminator="\n"
        )
        writer.writeheader()
        writer.writerows(report.to_dict() for report in reports)
    # On stderr: stdout stays the findings alone, and a clean run still says what it did.
    print(summary.line(), file=sys.stderr)
    return 0 if args.exit_zero or not reports else 1


def run_analyze_command(args: argparse.Namespace) -> int:
    """``keras-dp analyze`` with the parsed ``args``; returns the exit status."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import pandas as pd

    from keras_dp_tools.analysis import find_traces
    from keras_dp_tools.analysis.runner import analyze_windows
    from keras_dp_tools.records.facts import RunFacts

    for line in _interrupted_windows(args.source):
        print(line, file=sys.stderr, flush=True)
    traces = find_traces(args.source)
    recorded = _recorded_facts(args.source)
    windows = []
    given = _given_facts(args)
    for trace in traces:
        facts = dataclasses.replace(recorded.get(trace.resolve(), RunFacts()), **given)
        windows.append((trace, facts))

    def progress(done: int, total: int, window) -> None:
        print(f"analysing: {window.trace} done ({done}/{total})", file=sys.stderr, flush=True)

    frames = []
    for window in analyze_windows(windows, args.jobs, progress=progress):
        trace, breakdown = window.trace, window.breakdown
        # A partial capture (killed while writing: ValueError) or a trace that took its
        # process down (RuntimeError) costs only itself.
        if isinstance(window.error, (ValueError, RuntimeError)):
            print(f"skipped {trace}: {window.error}", file=sys.stderr, flush=True)
            continue
        if window.error is not None:
            raise window.error
        if breakdown.unmeasured:  # their rows stay, empty, with the reason
            print(f"{trace}: {breakdown.unmeasured}", file=sys.stderr, flush=True)
        for line in _trace_notes(breakdown):
            print(f"{trace}: {line}", file=sys.stderr, flush=True)
        frame = breakdown.replicas if args.per_replica else breakdown.steps
        frames.append(frame.assign(trace=str(trace)))
    if not frames:
        raise ValueError(f"none of the {len(traces)} trace(s) under {args.source} could be read")
    table = pd.concat(frames, ignore_index=True)
    if table.empty:
        raise ValueError(
            f"no host events in {len(traces)} trace(s) under {args.source}: the profiler "
            "captured no steps (was anything running between start and stop?)"
        )
    if args.format == "csv":
        table.to_csv(sys.stdout, index=False)
    elif args.format == "json":
        print(table.to_json(orient="records", indent=2))
    else:
        with pd.option_context("display.width", 200, "display.max_columns", 40):
            print(table.drop(columns="trace").round(3).to_string(index=False))
    return 0


def _given_facts(args: argparse.Namespace) -> dict:
    """The run's facts given on the command line (they win over the records')."""
    given = {"allreduce_bytes": args.allreduce_bytes, "replicas_in_sync": args.replicas_in_sync}
    if args.devices:
        devices = tuple(device.strip() for device in args.devices.split(",") if device.strip())
        given.update(devices=devices, local_replicas=len(devices))
    return {name: value for name, value in given.items() if value is not None}


def _trace_notes(breakdown) -> list[str]:
    """What a reader of a trace's rows must know beyond them: where the steps came from
    (when not from our markers), the devices that are not replicas, the unknown facts."""
    from keras_dp_tools.analysis.breakdown.step_sources import STEP_SOURCES

    notes = []
    if breakdown.step_source not in (None, "kdp_marker"):
        notes.append(f"steps from {STEP_SOURCES[breakdown.step_source]}")
    for row in breakdown.devices_apart.itertuples():
        notes.append(f"{row.device} is not a replica (it ran no model kernel): {row.did}")
    if breakdown.unknown:
        notes.append(f"unknown: {breakdown.unknown}")
    return notes


def _interrupted_windows(source: Path) -> list[str]:
    """Profiler windows the records say were cut short: they have no capture to analyse."""
    if not source.is_dir():
        return []
    try:
        windows = keras_dp_tools.Report.load(source, trials=True).windows
    except (FileNotFoundError, ValueError):
        return []
    return [
        f"skipped window {int(row.window)} of run {row.run} worker {row.worker} (from step "
        f"{row.start_step}): {row.reason}"
        for row in windows[windows["status"] == "interrupted"].itertuples()
    ]


def _recorded_facts(source: Path) -> dict:
    """Per trace (resolved path), the run's facts its window record holds
    (``RunFacts.from_record``). Records written before the window held them all give
    the byte fields only: the run's header gives its devices and replicas."""
    from keras_dp_tools.records.facts import RECORD_FIELDS, RunFacts
    from keras_dp_tools.records.reader import find_record_files, read_records_by_type

    if not source.is_dir():
        return {}
    try:
        paths = find_record_files(source, trials=True)  # each trace with its own records
    except FileNotFoundError:
        return {}
    facts = {}
    for path in paths:
        frames = read_records_by_type(path)
        windows = frames.get("window")
        if windows is None or "trace" not in windows:
            continue
        headers = _last_headers(frames.get("header"))
        log_dir = path.parent.parent  # <log_dir>/keras_dp/worker-<i>.jsonl
        for window in windows.dropna(subset=["trace"]).to_dict("records"):
            header = headers.get((window["run"], window["worker"]), {})
            devices = header.get("devices")
            devices = None if not _present(devices) else list(devices)
            known = {
                "replicas_in_sync": header.get("replicas"),
                "devices": devices,
                "local_replicas": len(devices) if devices else None,
            }
            known.update(
                (name, value)
                for name, value in window.items()
                if name in RECORD_FIELDS and _present(value)
            )
            facts[(log_dir / window["trace"]).resolve()] = RunFacts.from_record(known)
    return facts


def _last_headers(headers) -> dict:
    """The latest header record of each (run, worker), as a dict."""
    if headers is None:
        return {}
    return {(row["run"], row["worker"]): row for row in headers.to_dict("records")}


def _present(value) -> bool:
    """Whether a value read back from records holds something (lists always do)."""
    import pandas as pd

    return value is not None and (not pd.api.types.is_scalar(value) or not pd.isna(value))


def run_doctor_command(args: argparse.Namespace) -> int:
    """``keras-dp doctor`` with the parsed ``args``; returns the exit status."""
    from keras_dp_tools.tools.doctor import run_doctor

    return run_doctor(profile=not args.no_profile, check=args.check)


def run_docs_command(args: argparse.Namespace) -> int:
    """``keras-dp docs`` with the parsed ``args``; returns the exit status."""
    from keras_dp_tools.tools import shipped

    if args.topic is None:
        for topic, title in shipped.topics().items():
            print(f"{topic:20} {title}")
        return 0
    path = shipped.page(args.topic)  # ValueError: exit 1, with the topics
    print(path if args.path else path.read_text(), end="\n" if args.path else "")
    return 0


def run_notebook_command(args: argparse.Namespace) -> int:
    """``keras-dp notebook`` with the parsed ``args``; returns the exit status."""
    from keras_dp_tools.tools.demo import notebook_hint
    from keras_dp_tools.tools.shipped import copy_notebook

    written = copy_notebook(args.dest, force=args.force)
    print(f"Wrote {written}. Open it on a run:\n  {notebook_hint('<log dir>', written)}")
    return 0


# What runs each command of build_parser(), by the command's name.
HANDLERS = {
    "demo": run_demo_command,
    "analyze": run_analyze_command,
    "lint": run_lint_command,
    "report": run_report_command,
    "sweep": run_sweep_command,
    "doctor": run_doctor_command,
    "launch": run_launch_command,
    "tune-allreduce": run_tune_allreduce_command,
    "compare-strategies": run_compare_strategies_command,
    "docs": run_docs_command,
    "notebook": run_notebook_command,
}


def main(argv: list[str] | None = None) -> int:
    """The ``keras-dp`` command (also ``python -m keras_dp_tools``).

    Args:
        argv: the arguments after the program's name (default: ``sys.argv[1:]``).

    Returns:
        The exit status: 0 on success, 2 on a usage error, 1 on a failure the message
        explains (no traceback).

    Example:

    ```python
    from keras_dp_tools.tools.cli import main

    main(["report", "runs/exp1", "--html", "report.html"])
    ```
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    # "keras-dp sweep SCRIPT --replicas 1,2 -- ARGS": ARGS belong to the script, untouched.
    script_args = []
    if "--" in argv and {"sweep", "launch"} & set(argv[: argv.index("--")]):
        argv, script_args = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    args = build_parser().parse_args(argv)
    if args.command in ("sweep", "launch"):
        args.script_args = [*args.script_args, *script_args]
    try:
        return HANDLERS[args.command](args)
    except UsageError as error:
        print(f"keras-dp {args.command}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except (ValueError, RuntimeError, OSError) as error:  # told, not traced
        print(f"keras-dp {args.command}: error: {error}", file=sys.stderr)
        return EXIT_FAILURE
