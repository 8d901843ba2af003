"""``find_per_replica_batch``: the largest per-replica batch that trains without running
out of memory, each trial in its own process, then the scaling plan for it."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from keras_dp_tools.common.validation import require_positive_int
from keras_dp_tools.setup.scaling import ScalingPlan, plan_scaling
from keras_dp_tools.tools.tuning.child import (
    Child,
    ChildFailed,
    ContractError,
    check_dataset_contract,
    function_reference,
    refuse_inside_a_trial,
)

MODES = ("power", "binsearch")
TRIAL_COLUMNS = ["per_replica_batch", "global_batch", "fits", "peak_mib", "seconds", "reason"]
_CPU_DEVICE = re.compile(r"(?:^|/)(?:device:)?CPU:(\d+)$", re.IGNORECASE)


@dataclass
class BatchSearch:
    """The result of ``find_per_replica_batch``.

    Attributes:
        per_replica_batch: the largest per-replica batch that fit (None: not even 1).
        global_batch: ``per_replica_batch * replicas`` (None likewise).
        replicas: replicas of the strategy.
        plan: ``kdt.plan_scaling`` for that batch (None without ``base_batch`` or a
            learning rate, or when nothing fit).
        trials: one row per trial (``TRIAL_COLUMNS``), in the order run.
        note: the result in words.

    Example:

    ```python
    search = kdt.find_per_replica_batch(build_model, make_dataset, strategy, base_batch=256)
    print(search)  # the trials, the note, and the scaling plan
    batch = search.global_batch  # per_replica_batch x replicas
    ```
    """

    per_replica_batch: int | None
    global_batch: int | None
    replicas: int
    plan: ScalingPlan | None
    trials: pd.DataFrame
    note: str

    def __str__(self) -> str:
        parts = [self.trials.round(2).to_string(index=False), "", self.note]
        if self.plan is not None:
            parts += ["", self.plan.explanation]
        return "\n".join(parts)


def _devices(strategy) -> tuple[list[str], int | None]:
    """The strategy's devices, and how many logical CPUs the child must split into."""
    if isinstance(strategy, int) and not isinstance(strategy, bool):
        from keras_dp_tools.tools.sweep import gpu_ids

        count = require_positive_int("strategy (a replica count)", strategy)
        if gpu_ids():
            return [f"/gpu:{index}" for index in range(count)], None
        return [f"/cpu:{index}" for index in range(count)], count
    devices = list(getattr(getattr(strategy, "extended", None), "worker_devices", []) or [])
    if not devices:
        raise TypeError(
            "strategy must be a tf.distribute strategy (its devices are used again in "
            f"each trial process) or a replica count; received {strategy!r}."
        )
    cpus = [int(match.group(1)) for d in devices if (match := _CPU_DEVICE.search(d))]
    return devices, (max(cpus) + 1 if cpus else None)


def _next_batch(trials: list[dict], mode: str, max_batch: int) -> int | None:
    """The next per-replica batch to try, or None when the search is over."""
    fitting = [t["per_replica_batch"] for t in trials if t["fits"]]
    failing = [t["per_replica_batch"] for t in trials if not t["fits"]]
    low = max(fitting, default=0)
    high = min(failing, default=None)
    if not trials:
        return 1
    if high is None:  # still doubling
        return low * 2 if low * 2 <= max_batch else None
    if mode == "power" or high - low <= 1 or low == 0:
        return None
    return (low + high) // 2


def find_per_replica_batch(
    build_model,
    make_dataset,
    strategy,
    *,
    mode: str = "power",
    max_memory_bytes: int | None = None,
    steps: int = 3,
    max_batch: int = 65536,
    base_lr: float | None = None,
    base_batch: int | None = None,
    rule: str = "linear",
    log_dir: str | os.PathLike | None = None,
    progress: Callable[[str], None] | None = print,
    timeout: float = 600,
) -> BatchSearch:
    """Finds the largest per-replica batch that trains ``steps`` steps within memory.

    Each trial trains in a fresh process over the strategy's devices, so an
    out-of-memory trial cannot take your program down and every trial starts from
    the same memory. On GPUs a trial fails on TensorFlow's ``ResourceExhaustedError``
    (or a peak allocation over ``max_memory_bytes``). On CPU nothing fails before
    the machine swaps, so you give the ceiling: the trial's memory is the growth of
    its process's resident memory from just before ``build_model`` (model, optimizer
    state, dataset, activations), watched every 10 ms and checked against the
    kernel's peak. ``mode="power"`` tries 1, 2, 4, ... and returns the largest power
    of two that fits; ``"binsearch"`` then bisects up to the first failing size.

    The functions reach the trial processes as references, as for
    ``kdt.tune_allreduce``: module-level functions, or ``"module:function"`` /
    ``"path/script.py:function"`` strings.

    Example:

    ```python
    # find_batch.py (functions as in examples/tune_allreduce_script.py)
    import keras_dp_tools as kdt
    from tune_allreduce_script import build_model, make_dataset

    if __name__ == "__main__":
        strategy = kdt.mirrored_strategy(2)
        found = kdt.find_per_replica_batch(
            build_model, make_dataset, strategy, mode="binsearch",
            max_memory_bytes=2 * 2**30, base_lr=1e-3, base_batch=64, rule="sqrt")
        print(found)  # trials, the batch, and the scaled learning rate
        dataset = make_dataset(found.global_batch)
    ```

    Args:
        build_model: returns a compiled Keras model (called in the strategy's scope).
        make_dataset: ``make_dataset(global_batch)`` returns a ``tf.data.Dataset`` of
            batches of ``global_batch`` examples (the contract ``tune_allreduce``
            shares). ``make_dataset(strategy)`` is accepted too: its batches are
            re-batched to each trial's size. Another first parameter is refused with a
            ``TypeError``; see docs/tuning.md.
        strategy: the ``tf.distribute`` strategy you train with (its devices are used
            again in each trial), or a replica count.
        mode: ``"power"`` or ``"binsearch"``.
        max_memory_bytes: the ceiling per trial; required without GPUs.
        steps: training steps per trial.
        max_batch: the largest per-replica batch to try.
        base_lr: the learning rate tuned for ``base_batch`` (default: the learning
            rate of ``build_model()``'s optimizer).
        base_batch: the global batch ``base_lr`` was tuned for; with it, ``plan`` is
            ``kdt.plan_scaling(...)`` for the found batch.
        rule: the scaling rule for ``plan`` (``"linear"``, ``"sqrt"``, ``"none"``).
        log_dir: where each trial's output log goes (default: a temporary folder,
            removed unless a trial failed unexpectedly).
        progress: called with a line per trial (default ``print``; None: quiet).
        timeout: seconds a trial may take.

    Returns:
        A ``BatchSearch``: the batch found, the scaling plan, and every trial.

    Raises:
        ValueError: an unknown ``mode``, or no ``max_memory_bytes`` without GPUs (the
            message says what to pass).
        TypeError: ``make_dataset``'s first parameter is neither a batch nor a strategy.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}; received {mode!r}.")
    steps = require_positive_int("steps", steps)
    max_batch = require_positive_int("max_batch", max_batch)
    if max_memory_bytes is not None:
        max_memory_bytes = require_positive_int("max_memory_bytes", max_memory_bytes)
    refuse_inside_a_trial("find_per_replica_batch")
    check_dataset_contract(make_dataset)  # its error now, not in every trial
    devices, cpu_devices = _devices(strategy)
    if max_memory_bytes is None and not any("GPU" in d.upper() for d in devices):
        raise ValueError(
            "Without GPUs there is no out-of-memory error to find (the machine swaps "
            "first): pass max_memory_bytes, the memory a training process may use, e.g. "
            "max_memory_bytes=4 * 2**30."
        )
    replicas = len(devices)
    say = progress or (lambda line: None)
    temporary = log_dir is None
    root = Path(tempfile.mkdtemp(prefix="kdt-batch-") if temporary else log_dir)
    spec = {
        "build_model": function_reference(build_model),
        "make_dataset": function_reference(make_dataset),
        "devices": devices,
        "cpu_devices": cpu_devices,
        "steps": steps,
        "max_memory_bytes": max_memory_bytes,
    }
    trials: list[dict] = []
    learning_rate = None
    unexpected = False
    while (batch := _next_batch(trials, mode, max_batch)) is not None:
        say(f"trial {len(trials) + 1}: {batch} per replica ({batch * replicas} global)")
        child = Child(
            "keras_dp_tools.tools.tuning._batch_trial",
            {**spec, "per_replica_batch": batch},
            root / f"batch-{batch}.log",
        )
        try:
            answer = child.wait(timeout)
        except ChildFailed as error:
            if error.contract:  # every size would fail alike
                child.close(timeout=10)
                raise ContractError(str(error)) from None
            answer = {"fits": False, "reason": _failure_reason(child, error)}
            unexpected = unexpected or "ceiling" not in answer["reason"]
        except BaseException:  # Ctrl-C: its SIGINT does not reach the trial's own session
            child.close(timeout=0)
            raise
        finally:
            child.close(timeout=10)
        learning_rate = answer.get("learning_rate", learning_rate)
        peak = answer.get("peak_bytes")
        trials.append(
            {
                "per_replica_batch": batch,
                "global_batch": batch * replicas,
                "fits": answer["fits"],
                "peak_mib": None if peak is None else peak / 2**20,
                "seconds": answer.get("seconds"),
                "reason": answer.get("reason"),
            }
        )
        say(f"  {'fits' if answer['fits'] else 'does not fit: ' + str(answer.get('reason'))}")
    if temporary and not unexpected:
        shutil.rmtree(root, ignore_errors=True)
    table = pd.DataFrame(trials, columns=TRIAL_COLUMNS)
    fitting = table.loc[table["fits"].astype(bool), "per_replica_batch"]
    best = int(fitting.max()) if len(fitting) else None
    plan = None
    base_lr = base_lr if base_lr is not None else learning_rate
    if best is not None and base_batch is not None and base_lr is not None:
        plan = plan_scaling(replicas, best, base_lr=base_lr, base_batch=base_batch, rule=rule)
    return BatchSearch(
        per_replica_batch=best,
        global_batch=None if best is None else best * replicas,
        replicas=replicas,
        plan=plan,
        trials=table,
        note=_note(table, best, replicas, mode, max_batch, max_memory_bytes),
    )


def _failure_reason(child: Child, error: ChildFailed) -> str:
    from keras_dp_tools.tools.tuning._batch_trial import OVER_CEILING

    code = child.process.poll()
    if code == OVER_CEILING:
        return "resident memory grew over the ceiling during the trial"
    if code is not None and code < 0:
        return f"the process was killed by signal {-code} (out of memory?): {child.log_tail(2)}"
    return str(error)[-400:]


# Words of a trial's reason when it ran out of memory (_failure_reason, _batch_trial).
MEMORY_REASONS = ("ceiling", "out of memory", "killed by signal")


def _note(table, best, replicas, mode, max_batch, ceiling) -> str:
    limit = f"{ceiling / 2**20:.0f} MiB per process" if ceiling else "the GPUs' memory"
    if best is None:
        reason = table["reason"].iloc[0] if len(table) else "no trial ran"
        if not any(word in reason for word in MEMORY_REASONS):
            return (
                f"The first trial (1 per replica) failed for another reason than memory: {reason}."
            )
        return (
            f"Even a per-replica batch of 1 does not fit in {limit} ({reason}). Use a "
            "smaller model, mixed precision, or more memory."
        )
    if table["fits"].all():
        return (
            f"Every size up to {best} per replica fit in {limit}; the search stopped at "
            f"max_batch={max_batch}. Global batch: {best * replicas}."
        )
    failing = int(table.loc[~table["fits"].astype(bool), "per_replica_batch"].min())
    exact = "" if mode == "binsearch" or failing == best + 1 else " (largest power of two)"
    return (
        f"The largest per-replica batch that fits in {limit}: {best}{exact}; {failing} did "
        f"not. Global batch over {replicas} replicas: {best * replicas}."
    )
