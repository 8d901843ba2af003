"""``tune_allreduce``: measure each cross-device all-reduce implementation, pick one.

Every candidate runs in its own process (TensorFlow's collective state does not reset
within one), all of them started together and kept alive, then measured in turns:
round after round, each candidate trains a block of steps while the others wait. A
slow phase of a shared machine then hits every candidate alike, and the decision is
a ratio of medians of block medians from the same rounds.
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from keras_dp_tools.analysis.strategies import within_noise
from keras_dp_tools.common.validation import require_positive_int
from keras_dp_tools.records.contract import REPLICAS_ENV
from keras_dp_tools.tools.tuning.child import (
    check_dataset_contract,
    function_reference,
    refuse_inside_a_trial,
)
from keras_dp_tools.tools.tuning.rounds import (
    WARMUP_STEPS,
    Launch,
    Outcome,
    result_text,
    run_in_rounds,
)

TABLE_COLUMNS = [
    "candidate",
    "status",
    "step_ms",
    "spread_pct",
    "allreduce_ms",
    "busbw_gbps",
    "cross_device_ops",
    "reason",
]

_COLLECTIVE = (
    "cross_device_ops_lib.CollectiveAllReduce(devices=devices, group_size=len(devices), "
    "options=tf.distribute.experimental.CommunicationOptions({}))"
)
_IMPLEMENTATION = "implementation=tf.distribute.experimental.CommunicationImplementation.{}"


@dataclass(frozen=True)
class Candidate:
    """One way to all-reduce: ``cross_device_ops`` is the Python expression given to
    ``tf.distribute.MirroredStrategy(devices, cross_device_ops=...)`` ("None": the
    default); ``gpu_only`` ones are skipped without GPUs; ``cpu_skip`` says why one is
    not worth measuring on CPU devices.

    Example:

    ```python
    from keras_dp_tools.tools.tuning.allreduce import CANDIDATES

    print(CANDIDATES["collective"].code("['/gpu:0', '/gpu:1']"))  # the strategy's code
    ```
    """

    name: str
    cross_device_ops: str
    description: str
    gpu_only: bool = False
    cpu_skip: str | None = None

    def code(self, devices: str) -> str:
        """Python lines that build the strategy (``devices``: an expression)."""
        lines = ["import tensorflow as tf"]
        if "cross_device_ops_lib" in self.cross_device_ops:
            lines.append(
                "from tensorflow.python.distribute import cross_device_ops as cross_device_ops_lib"
            )
        if "kdt." in devices:
            lines.append("import keras_dp_tools as kdt")
        lines.append(f"devices = {devices}")
        argument = (
            "" if self.cross_device_ops == "None" else f", cross_device_ops={self.cross_device_ops}"
        )
        lines.append(f"strategy = tf.distribute.MirroredStrategy(devices{argument})")
        return "\n".join(lines)


def _candidates() -> dict[str, Candidate]:
    mib = 1024 * 1024
    listed = [
        Candidate("collective", "None", "MirroredStrategy's default: CollectiveAllReduce"),
        Candidate(
            "collective_ring",
            _COLLECTIVE.format(_IMPLEMENTATION.format("RING")),
            "CollectiveAllReduce, ring implementation",
            cpu_skip="on CPU devices the default collective already uses the ring "
            "implementation (same as 'collective')",
        ),
        Candidate(
            "collective_nccl",
            _COLLECTIVE.format(_IMPLEMENTATION.format("NCCL")),
            "CollectiveAllReduce, NCCL implementation",
            gpu_only=True,
        ),
        *(
            Candidate(
                f"collective_pack_{size}mib",
                _COLLECTIVE.format(f"bytes_per_pack={size * mib}"),
                f"CollectiveAllReduce, gradients packed in {size} MiB packs",
            )
            for size in (1, 32)
        ),
        Candidate(
            "reduction_to_one_device",
            "tf.distribute.ReductionToOneDevice()",
            "reduce on one device, then broadcast",
        ),
        *(
            Candidate(
                f"nccl_packs_{packs}",
                f"tf.distribute.NcclAllReduce(num_packs={packs})",
                f"NcclAllReduce with {packs} pack(s)",
                gpu_only=True,
            )
            for packs in (1, 2)
        ),
        *(
            Candidate(
                f"hierarchical_copy_packs_{packs}",
                f"tf.distribute.HierarchicalCopyAllReduce(num_packs={packs})",
                f"HierarchicalCopyAllReduce with {packs} pack(s) (GPU copy topology)",
                gpu_only=True,
            )
            for packs in (1, 2)
        ),
    ]
    return {candidate.name: candidate for candidate in listed}


CANDIDATES = _candidates()


@dataclass
class AllReduceTuning:
    """The result of ``tune_allreduce``.

    Attributes:
        table: one row per candidate (``TABLE_COLUMNS``): ``status`` is ``measured``,
            ``skipped`` or ``failed`` (``reason`` says why); ``step_ms`` the median
            over rounds of each round's median step time; ``spread_pct`` the range of
            the round medians relative to ``step_ms``; ``allreduce_ms`` and
            ``busbw_gbps`` the profiled steps' medians from the breakdown. Fastest first.
        best: the candidate to use: the fastest measured one when it beats the default
            (``collective``) by more than the larger of their rounds' spreads, else
            ``collective`` (MirroredStrategy's default; also with one round, when the noise
            is unknown); the fastest when the default was not measured (``note`` says
            so); None if none was measured.
        code: Python lines that build the best candidate's strategy.
        note: the decision in words: by how much the best beats the next, and the noise.
        log_dir: where each candidate's records, traces and output log are.

    Example:

    ```python
    tuning = kdt.tune_allreduce(build_model, make_dataset, steps=20)
    print(tuning)  # the table, the decision and the code of the best candidate
    exec(tuning.code)  # builds `strategy`
    ```
    """

    table: pd.DataFrame
    best: str | None
    code: str | None
    note: str
    log_dir: Path
    codes: dict = field(default_factory=dict, repr=False)

    def __str__(self) -> str:
        with pd.option_context("display.width", 160, "display.max_columns", 20):
            shown = self.table.drop(columns="reason").round(3).to_string(index=False)
        return result_text(shown, self.note, self.table, self.code)


def _devices_expression(devices) -> str:
    """The expression for the strategy's devices in ``.code``. Logical CPU devices only
    exist once the CPU is split, so CPU lists become ``kdt.configure_devices(n)``."""
    if devices is None:
        return "kdt.configure_devices()"
    if isinstance(devices, int) and not isinstance(devices, bool):
        return f"kdt.configure_devices({require_positive_int('devices', devices)})"
    if isinstance(devices, (list, tuple)) and devices and all(isinstance(d, str) for d in devices):
        cpus = [d for d in devices if re.search(r"CPU:\d+$", d, re.IGNORECASE)]
        if not cpus:
            return repr(list(devices))
        expected = [f"/cpu:{index}" for index in range(len(devices))]
        if [d.lower().replace("device:", "") for d in devices] == expected:
            return f"kdt.configure_devices({len(devices)})"
    raise ValueError(
        f"devices must be None (all GPUs, or the CPU split in {REPLICAS_ENV} or 4), a "
        "replica count, a list of GPU names, or '/cpu:0' ... '/cpu:<n-1>'; received "
        f"{devices!r}."
    )


def _have_gpus() -> bool:
    from keras_dp_tools.tools.sweep import gpu_ids

    return bool(gpu_ids())


def _skip_reason(candidate: Candidate, gpus: bool) -> str | None:
    if candidate.gpu_only and not gpus:
        return f"needs GPUs ({candidate.description}); none are visible here"
    if candidate.cpu_skip and not gpus:
        return candidate.cpu_skip
    return None


def tune_allreduce(
    build_model,
    dataset,
    *,
    devices=None,
    steps: int = 20,
    candidates: Sequence[str] | None = None,
    rounds: int = 3,
    per_replica_batch: int | None = None,
    log_dir: str | os.PathLike | None = None,
    progress: Callable[[str], None] | None = print,
    timeout: float = 600,
) -> AllReduceTuning:
    """Measures each cross-device all-reduce implementation on your model; picks one.

    Candidates: ``collective`` (MirroredStrategy's default), ``collective_ring`` and
    ``collective_nccl`` (the implementation), ``collective_pack_1mib`` /
    ``collective_pack_32mib`` (``CommunicationOptions(bytes_per_pack=...)``),
    ``reduction_to_one_device``, and on GPUs ``nccl_packs_1/2`` (``NcclAllReduce``) and
    ``hierarchical_copy_packs_1/2`` (``HierarchicalCopyAllReduce``). Those that do not
    apply here are listed as skipped with the reason.

    Each candidate runs in its own process, so ``build_model`` and ``dataset`` must be
    importable there: module-level functions (of a module, or of the script you run:
    the script is imported again under another name, so keep its training under
    ``if __name__ == "__main__":``), or strings ``"package.module:function"`` /
    ``"path/script.py:function"``. Lambdas and nested functions cannot be sent.

    Example:

    ```python
    # tune_me.py
    import keras, numpy as np, tensorflow as tf
    import keras_dp_tools as kdt

    def build_model():  # called inside strategy.scope()
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256),
                                  keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
        return model

    def make_dataset(global_batch):  # batches of global_batch examples
        x = np.zeros((1024, 64), "float32")
        return tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(global_batch)

    if __name__ == "__main__":
        result = kdt.tune_allreduce(build_model, make_dataset, devices=2, steps=20,
                                    per_replica_batch=32)
        print(result)       # the table, the decision and the code
        print(result.code)  # tf.distribute.MirroredStrategy(devices, cross_device_ops=...)
    ```

    Args:
        build_model: returns a compiled Keras model; called inside the strategy's scope
            (with the strategy, if it takes an argument).
        dataset: ``make_dataset(global_batch)``, returning a ``tf.data.Dataset`` of
            batches of ``global_batch`` examples (``per_replica_batch * replicas``;
            the contract ``find_per_replica_batch`` shares). Also accepted:
            ``make_dataset(strategy)`` or ``make_dataset()`` returning global batches
            of its choosing (re-batched when ``per_replica_batch`` is given). Another
            first parameter is refused with a ``TypeError``; see docs/tuning.md.
        devices: None (all GPUs, or the CPU split into ``KERAS_DP_REPLICAS`` or 4
            logical devices), a replica count, a list of GPU names, or
            ``["/cpu:0", ..., "/cpu:<n-1>"]``.
        steps: measured steps per candidate, spread over ``rounds`` blocks.
        candidates: names from ``CANDIDATES`` (default: all of them).
        rounds: blocks of steps per candidate, taken in turns with the others.
        per_replica_batch: see ``dataset``.
        log_dir: where the candidates' records and logs go (default: a temporary
            folder, removed afterwards unless something failed).
        progress: called with one line per stage (default ``print``; None: quiet).
        timeout: seconds a candidate may take to start or to run one block.

    Returns:
        An ``AllReduceTuning`` with ``.table``, ``.best``, ``.code`` and ``.note``.
    """
    steps = require_positive_int("steps", steps)
    if per_replica_batch is not None:
        per_replica_batch = require_positive_int("per_replica_batch", per_replica_batch)
    rounds = require_positive_int("rounds", rounds)
    say = progress or (lambda line: None)
    names = list(CANDIDATES) if candidates is None else list(candidates)
    unknown = [name for name in names if name not in CANDIDATES]
    if unknown or not names:
        raise ValueError(
            f"Unknown candidate(s) {unknown or names!r}; choose from {', '.join(CANDIDATES)}."
        )
    refuse_inside_a_trial("tune_allreduce")
    check_dataset_contract(dataset, batch_known=per_replica_batch is not None)
    references = {
        "build_model": function_reference(build_model),
        "dataset": function_reference(dataset),
    }
    devices_code = _devices_expression(devices)
    temporary = log_dir is None
    root = Path(tempfile.mkdtemp(prefix="kdt-tune-") if temporary else log_dir)
    gpus = _have_gpus()
    block = max(1, steps // rounds)

    rows = {name: {"candidate": name, "status": "skipped", "reason": None} for name in names}
    codes = {name: CANDIDATES[name].code(devices_code) for name in names}
    launches: dict[str, list[Launch]] = {}
    for name in names:
        reason = _skip_reason(CANDIDATES[name], gpus)
        if reason:
            rows[name]["reason"] = reason
            say(f"{name}: skipped ({reason})")
            continue
        spec = {
            **references,
            "code": codes[name],
            "log_dir": str(root / name),
            "warmup_steps": WARMUP_STEPS,
            "per_replica_batch": per_replica_batch,
        }
        launches[name] = [
            Launch("keras_dp_tools.tools.tuning._allreduce_trial", spec, root / name / "output.log")
        ]
    outcome = run_in_rounds(
        launches,
        block=block,
        rounds=rounds,
        timeout=timeout,
        say=say,
        log_dir=root,
        describe_ready=lambda ready: (
            f"ready ({ready['cross_device_ops']}, {ready['replicas']} replicas)"
        ),
    )
    _outcome_rows(rows, outcome, root)
    table = pd.DataFrame(list(rows.values())).reindex(columns=TABLE_COLUMNS)
    order = {"measured": 0, "failed": 1, "skipped": 2}
    table = table.sort_values(
        ["status", "step_ms"],
        key=lambda column: column.map(order) if column.name == "status" else column,
    ).reset_index(drop=True)
    measured = table[table["status"] == "measured"].dropna(subset=["step_ms"])
    best, note = _decision(measured)
    say(note)
    if temporary and not outcome.failures:
        shutil.rmtree(root, ignore_errors=True)
    return AllReduceTuning(
        table=table,
        best=best,
        code=CANDIDATES[best].code(devices_code) if best else None,
        note=note,
        log_dir=root,
        codes=codes,
    )


def _outcome_rows(rows: dict[str, dict], outcome: Outcome, root: Path) -> None:
    """Each run candidate's row: measured (from its records), or failed with the reason,
    with the cross-device ops it was ready with, if it got that far."""
    for name, reason in outcome.failures.items():
        rows[name].update(status="failed", reason=reason)
        if name in outcome.ready:
            rows[name]["cross_device_ops"] = outcome.ready[name]["cross_device_ops"]
    for name in outcome.measured:
        blocks = [(answer["first_step"], answer["last_step"]) for answer in outcome.blocks[name]]
        rows[name].update(
            _measure(root / name, blocks),
            status="measured",
            cross_device_ops=outcome.ready[name]["cross_device_ops"],
        )


def _measure(log_dir: Path, blocks: list[tuple[int, int]]) -> dict:
    """A candidate's step time (median of block medians), their spread, and the
    profiled steps' all-reduce time and bus bandwidth, from its records."""
    from keras_dp_tools.report.facade import Report

    steps = Report.load(log_dir, trials=True).steps
    timed = steps[~steps["warmup"].fillna(False).astype(bool) & ~steps["profiled"]]
    medians = [
        timed.loc[(timed["step"] >= first) & (timed["step"] < last), "step_ms"].median()
        for first, last in blocks
    ]
    medians = [value for value in medians if pd.notna(value)]
    step_ms = statistics.median(medians) if medians else None
    # One block measures no spread: unknown, and the decision says so.
    spread = (max(medians) - min(medians)) / step_ms * 100 if len(medians) > 1 else None
    profiled = steps.dropna(subset=["allreduce_ms"])
    return {
        "step_ms": step_ms,
        "spread_pct": spread,
        "allreduce_ms": profiled["allreduce_ms"].median() if len(profiled) else None,
        "busbw_gbps": profiled["busbw_gbps"].median() if len(profiled) else None,
    }


DEFAULT = "collective"  # MirroredStrategy's own choice: what to keep without a clear win


def _decision(measured: pd.DataFrame) -> tuple[str | None, str]:
    """The candidate to use and why (``measured``: fastest first). Against the default
    only: the fastest replaces it when it is ahead by more than the larger round-to-round
    spread of the two; within it, or with the noise unknown (one round), the default is
    kept. A default that was not measured cannot be kept: the fastest is named, and the
    note says so."""
    if measured.empty:
        return None, "No candidate was measured: see the reasons in the table."
    best = measured.iloc[0]
    speed = f"{best.candidate} at {best.step_ms:.2f} ms per step"
    if len(measured) == 1:
        return best.candidate, f"Only {speed} was measured."
    default = measured[measured["candidate"] == DEFAULT]
    if default.empty:
        return best.candidate, (
            f"Fastest: {speed}; MirroredStrategy's default ({DEFAULT}) was not measured, "
            "so this is the fastest of those measured, not a win over the default."
        )
    default = default.iloc[0]
    if best.candidate == DEFAULT:
        return DEFAULT, f"Fastest: {speed}, MirroredStrategy's default: keep it."
    gain_pct = (default.step_ms / best.step_ms - 1) * 100
    spreads = (best.spread_pct, default.spread_pct)
    tie = within_noise(gain_pct, spreads)
    against = (
        f"Fastest: {speed}, {default.step_ms / best.step_ms:.2f}x faster than the default "
        f"{DEFAULT} ({default.step_ms:.2f} ms)"
    )
    if tie is None:
        return DEFAULT, (
            f"{against}; with one round the round-to-round noise is unknown, so keep "
            f"MirroredStrategy's default ({DEFAULT}): rounds >= 2 measure the noise."
        )
    if tie:
        return DEFAULT, (
            f"{against}, within the round-to-round spread of up to {max(spreads):.0f}%: no "
            f"clear win, so keep MirroredStrategy's default ({DEFAULT})."
        )
    return best.candidate, (
        f"{against}; round medians spread up to {max(spreads):.0f}%: a clear win."
    )
