"""``compare_strategies``: train the same model under each distribution strategy, side by
side, and say which is fastest here and why the others lose.

Each candidate runs in its own process or processes (one per worker for
``multi_worker_mirrored``), started together and measured in interleaved rounds, as
``tune_allreduce`` measures its candidates (``tools/tuning/rounds.py``): a slow phase
of a shared machine hits every candidate alike.
"""

from __future__ import annotations

import datetime
import os
import platform
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from keras_dp_tools.analysis import strategies as analysis
from keras_dp_tools.common.validation import require_positive_int, require_positive_number
from keras_dp_tools.records.comparison import (
    comparison_record,
    write_comparison,
)
from keras_dp_tools.report.comparison import RecordedComparison, display_table
from keras_dp_tools.tools.strategies import candidates as registry
from keras_dp_tools.tools.tuning.child import (
    check_dataset_contract,
    function_reference,
    refuse_inside_a_trial,
)
from keras_dp_tools.tools.tuning.rounds import WARMUP_STEPS, result_text, run_in_rounds

# The table's columns that ``--format csv`` prints (people read ``shown()``); the table
# keeps the per-round rates and evidence too.
SHOWN_COLUMNS = [
    column
    for column in analysis.TABLE_COLUMNS
    if column not in ("label", "reason", "round_examples_per_s", "evidence_note")
]


class ComparisonArgumentError(ValueError):
    """An argument of ``compare_strategies`` it cannot run with (unknown or repeated
    candidates, options, steps, rounds, batch, timeout): raised before any trial
    starts; ``keras-dp compare-strategies`` exits 2 on it, as on its own usage errors.

    Example:

    ```python
    from keras_dp_tools.tools.strategies.compare import ComparisonArgumentError

    try:
        kdt.compare_strategies(build_model, make_dataset, candidates=["mirrored", "nope"])
    except ComparisonArgumentError as error:
        print(error)  # names the unknown candidate and those there are
    ```
    """


@dataclass
class StrategyComparison:
    """The result of ``compare_strategies`` (also ``StrategyComparison.load(log_dir)``).

    Attributes:
        table: one row per candidate, fastest first: ``status`` (measured, failed,
            skipped; ``reason`` says why not measured), ``replicas``, ``examples_per_s``
            (median over rounds), ``spread_pct`` (range of the rounds' rates over the
            median), ``speedup`` (over ``one_device``; NaN when it was not measured),
            ``step_ms`` (median over rounds), and from the profiled steps ``comm_ms``
            (exposed communication per step), ``comm_share``, ``bytes_per_step`` and
            ``bytes_source`` ("trace" or "model sizes"); ``round_examples_per_s`` holds
            each round's rate, ``evidence`` everything the profile measured.
        best: the measured candidate with the most examples per second (None if none).
        code: Python lines that build the best candidate's strategy.
        verdict: the winner, and the measured reason each other candidate loses.
        log_dir: where the candidates' records, traces, logs and the comparison record are;
            None when no ``log_dir`` was given and nothing failed (the temporary folder
            is removed).
        codes: every candidate's code.
        settings: steps, rounds, per-replica batch, options of the comparison.
        record: the ``strategy_comparison.json`` record (``keras-dp compare-strategies
            --format json`` prints it).

    Example:

    ```python
    import keras_dp_tools as kdt

    comparison = kdt.StrategyComparison.load("runs/strategies")
    print(comparison.verdict)
    print(comparison.shown())  # the table as the HTML report shows it
    ```
    """

    table: pd.DataFrame
    best: str | None
    code: str | None
    verdict: str
    log_dir: Path | None
    codes: dict = field(default_factory=dict, repr=False)
    settings: dict = field(default_factory=dict, repr=False)
    record: dict = field(default_factory=dict, repr=False)

    def shown(self, reasons: bool = True) -> pd.DataFrame:
        """The table for people, as the HTML report and the dashboard show it
        (``keras_dp_tools.report.comparison.display_table``): labelled columns with
        their units, shares in %, "not measured" where there is no number."""
        return display_table(self.table, reasons=reasons)

    def __str__(self) -> str:
        with pd.option_context("display.width", 250, "display.max_columns", 20):
            # The reasons are listed under the table (result_text).
            shown = self.shown(reasons=False).to_string(index=False)
        note = analysis.speedup_note(self.table)
        verdict = f"{self.verdict}\n({note})" if note else self.verdict
        return result_text(shown, verdict, self.table, self.code)

    def _repr_html_(self) -> str:
        import html

        note = analysis.speedup_note(self.table)
        code = f"<pre>{html.escape(self.code)}</pre>" if self.code else ""
        return (
            self.shown().to_html(index=False)
            + f"<p>{html.escape(self.verdict)}</p>"
            + (f"<p>({html.escape(note)})</p>" if note else "")
            + code
        )

    @classmethod
    def load(cls, log_dir: str | os.PathLike) -> StrategyComparison:
        """The comparison recorded in ``log_dir`` by ``compare_strategies``. Raises
        FileNotFoundError where there is none, ValueError naming a file it cannot read."""
        found = RecordedComparison.load(log_dir)  # the one reading of a recorded table
        return cls.from_record(found.record, Path(log_dir), table=found.table)

    @classmethod
    def from_record(
        cls, record: dict, log_dir: Path | None, table: pd.DataFrame | None = None
    ) -> StrategyComparison:
        """The comparison a ``strategy_comparison.json`` record holds (one reading for
        a fresh result and a loaded one); ``table``: the record's table already read."""
        if table is None:
            table = analysis.table_from_record(record)
        settings = record.get("settings") or {}
        return cls(
            table=table,
            best=record.get("best"),
            code=record.get("code"),
            verdict=record.get("verdict", ""),
            log_dir=None if log_dir is None else Path(log_dir),
            codes=settings.get("codes", {}),
            settings=settings,
            record=record,
        )


def _versions() -> dict:
    from importlib import metadata

    import keras_dp_tools

    versions = {"keras_dp_tools": keras_dp_tools.__version__, "python": platform.python_version()}
    for package in ("tensorflow", "keras", "tf-keras"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return versions


def _names(strategies) -> list[str]:
    if isinstance(strategies, str):
        strategies = [strategies]
    names = list(registry.NAMES) if strategies is None else [str(s).strip() for s in strategies]
    unknown = [name for name in names if name not in registry.NAMES]
    if unknown or not names:
        raise ComparisonArgumentError(
            f"Unknown strategy candidate(s) {unknown or names!r}; choose from "
            f"{', '.join(registry.NAMES)}."
        )
    if len(set(names)) != len(names):
        raise ComparisonArgumentError(f"Each candidate once, please; received {names!r}.")
    return names


def _options(names: list[str], options, machine) -> dict[str, dict]:
    options = {} if options is None else options
    if not isinstance(options, Mapping) or not all(
        isinstance(value, Mapping) for value in options.values()
    ):
        raise TypeError(
            "options must map a candidate name to a dict of its options, e.g. "
            f"{{'multi_worker_mirrored': {{'workers': 2}}}}; received {options!r}."
        )
    unknown = [name for name in options if name not in names]
    if unknown:
        raise ComparisonArgumentError(
            f"options for {unknown!r}, which are not among the candidates {names!r}."
        )
    merged = {}
    for name in names:
        merged[name] = {**registry.default_options(name, machine), **options.get(name, {})}
        for key in ("replicas", "workers"):
            if key in merged[name]:
                require_positive_int(
                    f"options[{name!r}][{key!r}]", merged[name][key], ComparisonArgumentError
                )
    return merged


def compare_strategies(
    build_model,
    make_dataset,
    strategies: Sequence[str] | None = None,
    *,
    per_replica_batch: int = 32,
    steps: int = 30,
    rounds: int = 3,
    options: Mapping[str, Mapping] | None = None,
    log_dir: str | os.PathLike | None = None,
    progress: Callable[[str], None] | None = print,
    timeout: float = 600,
) -> StrategyComparison:
    """Trains your model under each distribution strategy and says which is fastest here.

    Candidates (``strategies``, default all): ``one_device``
    (``OneDeviceStrategy`` on the first GPU, or ``/cpu:0``), ``mirrored``
    (``MirroredStrategy``), ``central_storage`` (``CentralStorageStrategy``: variables
    on one device), ``multi_worker_mirrored`` (``MultiWorkerMirroredStrategy`` with
    local workers, tf_keras) and ``parameter_server`` (``ParameterServerStrategy`` with
    a local cluster, tf_keras). Without GPUs the CPU is split into ``KERAS_DP_REPLICAS``
    or 4 logical devices. Every candidate trains at the same ``per_replica_batch``.
    Candidates that cannot run here are listed as skipped, with the reason; one that
    fails or hangs (past ``timeout``) is listed as failed, and the others still run.

    Each candidate runs in its own processes, so ``build_model`` and ``make_dataset``
    must be importable there: module-level functions, or strings
    ``"package.module:function"`` / ``"path/script.py:function"`` (the same contract
    as ``tune_allreduce``: keep your training under ``if __name__ == "__main__":``).

    Example:

    ```python
    # compare_me.py
    import numpy as np, tensorflow as tf
    import keras_dp_tools as kdt

    def build_model():  # called inside strategy.scope()
        keras = tf.keras  # tf_keras under multi_worker_mirrored / parameter_server
        model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64),
                                  keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        return model

    def make_dataset(global_batch):
        x = np.ones((256, 32), "float32")
        return tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(global_batch)

    if __name__ == "__main__":
        result = kdt.compare_strategies(build_model, make_dataset,
                                        ["one_device", "mirrored"], steps=10, rounds=2,
                                        per_replica_batch=16)
        print(result)  # the table, the verdict and the code that builds the winner
    ```

    Args:
        build_model: returns a compiled Keras model; called inside the strategy's scope
            (with the strategy, if it takes an argument).
        make_dataset: ``make_dataset(global_batch)`` returning a ``tf.data.Dataset`` of
            batches of ``global_batch`` (= ``per_replica_batch`` x the candidate's
            replicas) examples; or ``make_dataset(strategy)`` / ``make_dataset()``,
            re-batched to the global batch (see docs/tuning.md).
        strategies: candidate names (default: all of them).
        per_replica_batch: examples per replica per step, the same for every candidate.
        steps: timed steps per candidate, spread over ``rounds`` blocks of
            ``steps // rounds`` (the record's ``settings["steps"]`` are those that ran).
        rounds: blocks of steps per candidate, taken in turns with the others.
        options: candidate name -> its options: ``{"replicas": n}`` for mirrored and
            central_storage, ``{"workers": n}`` for multi_worker_mirrored, the
            parameter-server candidate's own (``parameter_server.DEFAULT_OPTIONS``).
        log_dir: where the candidates' records and logs and ``strategy_comparison.json``
            go (default: a temporary folder, removed afterwards unless something failed).
        progress: called with one line per stage (default ``print``; None: quiet).
        timeout: seconds a candidate may take to start, to profile, or to run one block.

    Returns:
        A ``StrategyComparison`` with ``.table``, ``.best``, ``.code`` and ``.verdict``.
    """
    steps = require_positive_int("steps", steps, ComparisonArgumentError)
    rounds = require_positive_int("rounds", rounds, ComparisonArgumentError)
    per_replica_batch = require_positive_int(
        "per_replica_batch", per_replica_batch, ComparisonArgumentError
    )
    timeout = require_positive_number("timeout (seconds)", timeout, ComparisonArgumentError)
    if steps < rounds:
        raise ComparisonArgumentError(
            f"steps={steps} is fewer than rounds={rounds}: each round needs at least one step."
        )
    names = _names(strategies)
    refuse_inside_a_trial("compare_strategies")
    check_dataset_contract(make_dataset)
    references = {
        "build_model": function_reference(build_model),
        "dataset": function_reference(make_dataset),
    }
    machine = registry.Machine.here()
    chosen = _options(names, options, machine)
    say = progress or (lambda line: None)
    temporary = log_dir is None
    root = Path(tempfile.mkdtemp(prefix="kdt-strategies-") if temporary else log_dir)
    block = steps // rounds
    if block * rounds != steps:
        say(f"steps={steps} in {rounds} rounds: {block} a round, {block * rounds} in all")

    skipped, codes, launches = {}, {}, {}
    for name in names:
        reason = registry.skip_reason(name, chosen[name], machine)
        if reason:
            skipped[name] = reason
            say(f"{name}: skipped ({reason})")
            continue
        codes[name] = registry.code(name, chosen[name], machine)
        spec = {
            **references,
            "candidate": name,
            "code": codes[name],
            "log_dir": str(root / name),
            "warmup_steps": WARMUP_STEPS,
            "per_replica_batch": per_replica_batch,
            "options": dict(chosen[name]),
        }
        launches[name] = registry.launches(name, chosen[name], machine, spec, root / name)
    outcome = run_in_rounds(
        launches,
        block=block,
        rounds=rounds,
        timeout=timeout,
        say=say,
        log_dir=root,
        describe_ready=lambda ready: f"ready ({ready['strategy']}, replicas: {ready['replicas']})",
    )

    rows = []
    for name in names:
        label = registry.LABELS[name]
        if name in skipped:
            rows.append(analysis.candidate_row(name, label, "skipped", reason=skipped[name]))
        elif name in outcome.failures:
            rows.append(
                analysis.candidate_row(name, label, "failed", reason=outcome.failures[name])
            )
        else:
            ready = outcome.ready[name]
            evidence = _with_model_sizes(name, ready, outcome.profile[name].get("evidence", {}))
            rows.append(
                analysis.candidate_row(
                    name,
                    label,
                    "measured",
                    replicas=ready["replicas"],
                    blocks=outcome.blocks[name],
                    evidence=evidence,
                )
            )
    table = analysis.comparison_table(rows)
    best = analysis.best(table)
    verdict = analysis.verdict(table)
    say(verdict)
    settings = {
        "strategies": names,
        "per_replica_batch": per_replica_batch,
        "steps": block * rounds,  # what ran: steps rounded down to whole rounds
        "rounds": rounds,
        "block_steps": block,
        "timeout": timeout,
        "options": chosen,
        "gpus": list(machine.gpus),
        "cpu_devices": None if machine.gpus else machine.cpu_replicas,
        "codes": codes,
        "build_model": references["build_model"],
        "make_dataset": references["dataset"],
    }
    record = comparison_record(
        time=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        table=table.to_dict("records"),
        verdict=verdict,
        best=best,
        code=codes.get(best),
        settings=settings,
        versions=_versions(),
    )
    write_comparison(root, record)
    if temporary and not outcome.failures:
        shutil.rmtree(root, ignore_errors=True)
        root = None  # nothing left to point to
    return StrategyComparison.from_record(record, root)


def _with_model_sizes(name: str, ready: dict, evidence: dict) -> dict:
    """Central storage moves no all-reduce our breakdown can see: the replicas read the
    variables from, and push their gradients to, the device that holds them. Where the
    trace gives no bytes, the model's sizes give what such copies would move (and say
    so): every replica's, but for the replica on the variables' device, which copies
    nothing; on logical CPU devices (``shared_memory``) hand-offs need not copy at all."""
    if name != "central_storage" or "bytes_per_step" in evidence:
        return evidence
    variable_bytes = ready.get("variable_bytes")
    if not variable_bytes:
        return evidence
    variable_device = ready.get("variable_device")
    replica_devices = [
        analysis.device_name(device) for device in ready.get("replica_devices") or ()
    ]
    on_replica = bool(variable_device) and analysis.device_name(variable_device) in replica_devices
    copying = ready["replicas"] - 1 if on_replica else ready["replicas"]
    return {
        **evidence,
        "read_bytes": variable_bytes * copying,
        "push_bytes": variable_bytes * copying,
        "bytes_per_step": 2 * variable_bytes * copying,
        "bytes_source": "model sizes",
        "variable_device": variable_device or "one device",
        "variable_on_replica": on_replica,
        "shared_memory": bool(replica_devices)
        and all(device.startswith("CPU") for device in replica_devices),
    }
