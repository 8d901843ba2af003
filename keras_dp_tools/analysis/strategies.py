"""A comparison of distribution strategies, from what each candidate measured: the
table (examples/s per round, speed-up over one device, where the time goes) and the
verdict, a sentence that names the winner and the measured reason each other loses.

Pure: it reads per-candidate dicts (``compare_strategies`` collects them from its trial
processes), never TensorFlow. A number it writes is one a candidate measured, or a
model size labelled as such; what was not measured is said, not guessed.
"""

from __future__ import annotations

import math
import statistics

import pandas as pd

TABLE_COLUMNS = [
    "candidate",
    "label",
    "status",
    "reason",
    "replicas",
    "global_batch",
    "examples_per_s",
    "spread_pct",
    "speedup",
    "step_ms",
    "comm_ms",
    "comm_share",
    "bytes_per_step",
    "bytes_source",
    "round_examples_per_s",
    "evidence_note",
]
# The numbers of the table (float; NaN where not measured).
NUMBER_COLUMNS = TABLE_COLUMNS[
    TABLE_COLUMNS.index("examples_per_s") : TABLE_COLUMNS.index("bytes_per_step") + 1
]
BASELINE = "one_device"
_STATUS_ORDER = {"measured": 0, "failed": 1, "skipped": 2}


def _number(value) -> float:
    return float(value) if value is not None else math.nan


def candidate_row(
    candidate: str,
    label: str,
    status: str,
    *,
    reason: str | None = None,
    replicas: int | None = None,
    blocks: list[dict] | None = None,
    evidence: dict | None = None,
) -> dict:
    """One candidate's row. ``blocks`` are its time answers, one per round
    (``{"steps", "examples", "seconds"}``); ``evidence`` its profile's evidence
    (``step_ms``, ``comm_ms``, ``bytes_per_step``, ``bytes_source``, ...: missing keys
    stay missing)."""
    evidence = dict(evidence or {})
    rates = [block["examples"] / block["seconds"] for block in blocks or () if block["seconds"] > 0]
    step_times = [block["seconds"] / block["steps"] * 1000 for block in blocks or ()]
    batches = [block["examples"] / block["steps"] for block in blocks or () if block["steps"]]
    examples_per_s = statistics.median(rates) if rates else math.nan
    # One round measures no spread: NaN, and the verdict says the noise is unknown.
    spread = (max(rates) - min(rates)) / examples_per_s * 100 if len(rates) > 1 else math.nan
    comm_ms = _number(evidence.get("comm_ms"))
    profiled_step_ms = _number(evidence.get("step_ms"))
    # Exposed communication over the profiled step it was measured in.
    comm_share = comm_ms / profiled_step_ms if profiled_step_ms > 0 else math.nan
    row = {
        "candidate": candidate,
        "label": label,
        "status": status,
        "reason": reason,
        "replicas": replicas,
        "global_batch": statistics.median(batches) if batches else None,
        "examples_per_s": examples_per_s,
        "spread_pct": spread,
        "speedup": math.nan,
        "step_ms": statistics.median(step_times) if step_times else math.nan,
        "comm_ms": comm_ms,
        "comm_share": _number(comm_share),
        "bytes_per_step": _number(evidence.get("bytes_per_step")),
        "bytes_source": evidence.get("bytes_source"),
        "round_examples_per_s": rates,
        "evidence_note": evidence.get("note"),
    }
    # Detail keys (read_bytes, push_bytes, compute_ms, variable_device, ...) ride along.
    row["evidence"] = evidence
    return row


def comparison_table(rows: list[dict]) -> pd.DataFrame:
    """The candidates' rows as a table: measured ones fastest first (examples/s), then
    failed, then skipped; ``speedup`` over ``one_device`` where it was measured (else
    NaN, and the row's ``evidence_note`` says why where it is measured itself)."""
    table = pd.DataFrame(rows)
    for column in [*TABLE_COLUMNS, "evidence"]:
        if column not in table.columns:
            table[column] = None
    measured = table["status"] == "measured"
    baseline = table[(table["candidate"] == BASELINE) & measured]
    if len(baseline) and baseline["examples_per_s"].iloc[0] > 0:
        table["speedup"] = table["examples_per_s"] / baseline["examples_per_s"].iloc[0]
    else:
        table["speedup"] = math.nan
    table = table.assign(_order=table["status"].map(_STATUS_ORDER).fillna(3))
    table = table.sort_values(["_order", "examples_per_s"], ascending=[True, False])
    table = table.drop(columns="_order").reset_index(drop=True)
    for column in ("replicas", "global_batch"):  # empty where not measured
        table[column] = pd.to_numeric(table[column]).round().astype("Int64")
    return table[[*TABLE_COLUMNS, "evidence"]]


def table_from_record(record: dict) -> pd.DataFrame:
    """The table a ``strategy_comparison.json`` record holds
    (``keras_dp_tools.records.comparison``), typed as ``comparison_table`` returns it:
    the numbers as float (NaN where the record has null), the counts as Int64 (a record
    written before ``global_batch`` existed gets it empty)."""
    table = pd.DataFrame(record["table"], columns=None if record["table"] else TABLE_COLUMNS)
    table = table.reindex(columns=[*TABLE_COLUMNS, *table.columns.difference(TABLE_COLUMNS)])
    for column in NUMBER_COLUMNS:
        table[column] = pd.to_numeric(table[column]).astype(float)
    for column in ("replicas", "global_batch"):
        table[column] = pd.to_numeric(table[column]).astype("Int64")
    return table


def speedup_note(table: pd.DataFrame) -> str | None:
    """Why the speed-ups are empty, if they are."""
    if table["speedup"].notna().any() or not (table["status"] == "measured").any():
        return None
    row = table[table["candidate"] == BASELINE]
    if row.empty:
        return f"no speed-up: {BASELINE} was not among the candidates"
    return f"no speed-up: {BASELINE} {row['status'].iloc[0]} ({row['reason'].iloc[0]})"


def best(table: pd.DataFrame) -> str | None:
    """The measured candidate with the most examples per second."""
    measured = table[table["status"] == "measured"].dropna(subset=["examples_per_s"])
    if measured.empty:
        return None
    return measured.loc[measured["examples_per_s"].idxmax(), "candidate"]


def _mb(value: float) -> str:
    return f"{value / 1e6:.1f} MB" if value >= 1e5 else f"{value / 1e3:.1f} kB"


def _ms(value: float) -> str:
    return f"{value / 1000:.2f} s" if value >= 1000 else f"{value:.1f} ms"


def _moves(evidence: dict, bytes_per_step: float) -> str:
    """ "2 x 94 MB" when reads and pushes are (about) equal, else their sum."""
    read, push = evidence.get("read_bytes"), evidence.get("push_bytes")
    if read and push and abs(read - push) <= 0.05 * max(read, push):
        return f"2 × {_mb((read + push) / 2)}"
    if read and push:
        return f"{_mb(read)} of reads + {_mb(push)} of pushes"
    return _mb(bytes_per_step)


def _examples(row: pd.Series) -> str:
    return f"{int(row['global_batch'])} examples" if pd.notna(row["global_batch"]) else "a step"


def behind_ms(row: pd.Series, winner: pd.Series) -> float:
    """How many ms a step of ``row`` takes longer than its examples take at ``winner``'s
    rate: its global batch over its own rate, less over the winner's. Per example, not
    per step, since the candidates' global batches differ (docs/strategies.md)."""
    if pd.isna(row["global_batch"]) or not row["examples_per_s"] > 0:
        return math.nan
    return row["global_batch"] * 1000 * (1 / row["examples_per_s"] - 1 / winner["examples_per_s"])


def _share_of_gap(row: pd.Series, winner: pd.Series) -> str:
    """Whether the exposed communication ``comm_ms`` explains the gap to the winner:
    the reason only when it covers most of it."""
    gap = behind_ms(row, winner)
    if not gap > 0 or pd.isna(row["comm_ms"]):
        return ""
    of_gap = f"of the {_ms(gap)} a step of {_examples(row)} is behind {winner['candidate']}'s rate"
    covered = row["comm_ms"] / gap
    if covered >= 1:
        return f", which accounts for all {of_gap}"
    if covered > 0.5:
        return f", which accounts for most ({covered:.0%}) {of_gap}"
    return f", which accounts for {_ms(row['comm_ms'])} {of_gap}; the rest is not attributed"


def device_name(device: str) -> str:
    """ "/job:localhost/replica:0/task:0/device:CPU:0" -> "CPU:0"."""
    return str(device).rsplit("device:", 1)[-1].upper()


def _central_storage(row: pd.Series, winner: pd.Series, evidence: dict, source: str) -> str:
    device = evidence.get("variable_device")
    where = device_name(device) if device and device != "one device" else "one device"
    if evidence.get("variable_on_replica"):
        where += ", one of its replicas' devices (whose replica copies nothing)"
    text = (
        f"its variables live on {where}; the model's size implies up to "
        f"{_moves(evidence, row['bytes_per_step'])} a step, if copied, to and from the "
        f"replicas{source}"
    )
    if evidence.get("shared_memory"):
        text += " (logical CPU devices hand tensors over in shared memory)"
    if pd.notna(row["comm_ms"]):
        return (
            text + f": {_ms(row['comm_ms'])}{_of_profiled(evidence)}" + _share_of_gap(row, winner)
        )
    note = row["evidence_note"] if isinstance(row["evidence_note"], str) else None
    return text + (f"; {note}" if note else "")


def _of_profiled(evidence: dict) -> str:
    step_ms = evidence.get("step_ms")
    return f" of a {_ms(step_ms)} profiled step" if step_ms else ""


def loss_reason(row: pd.Series, winner: pd.Series) -> str:
    """Why ``row`` is slower than ``winner``, from its own evidence: its communication
    is named the reason only where it covers most of the time a step is behind."""
    evidence = row["evidence"] if isinstance(row["evidence"], dict) else {}
    source = f" (from {row['bytes_source']})" if isinstance(row["bytes_source"], str) else ""
    has_comm = pd.notna(row["comm_ms"])
    has_bytes = pd.notna(row["bytes_per_step"])
    if row["candidate"] == "parameter_server" and has_bytes:
        moved = _moves(evidence, row["bytes_per_step"])
        text = f"the parameter servers move {moved} per step{source}"
        if has_comm and row["comm_ms"] > 0:
            gbits = row["bytes_per_step"] * 8 / (row["comm_ms"] / 1000) / 1e9
            text += f" at {gbits:.2f} Gbit/s: {_ms(row['comm_ms'])}{_of_profiled(evidence)}"
            text += _share_of_gap(row, winner)
        return text
    if row["candidate"] == "central_storage" and has_bytes:
        return _central_storage(row, winner, evidence, source)
    if row["candidate"] == BASELINE:
        # Its batch and step against the winner's, as measured: on CPU the winner's
        # "replicas" are logical devices sharing the same cores.
        if pd.notna(row["global_batch"]) and pd.notna(winner["global_batch"]):
            return (
                f"it trains {_examples(row)} a step in {_ms(row['step_ms'])}, "
                f"{winner['candidate']} {int(winner['global_batch'])} in "
                f"{_ms(winner['step_ms'])}; it has no communication to save"
            )
        return "it has no communication to save"
    if has_comm:
        share = f" ({row['comm_share']:.0%})" if pd.notna(row["comm_share"]) else ""
        size = f", {_mb(row['bytes_per_step'])} a step{source}" if has_bytes else ""
        return (
            f"its exposed all-reduce takes {_ms(row['comm_ms'])}{_of_profiled(evidence)}"
            f"{share}{size}{_share_of_gap(row, winner)}"
        )
    note = row["evidence_note"]
    return (
        f"where its time goes was not measured ({note})"
        if isinstance(note, str)
        else ("where its time goes was not measured")
    )


def within_noise(gain_pct: float, spreads) -> bool | None:
    """Whether a gap of ``gain_pct`` (% the faster is ahead) is within the round-to-round
    noise: the larger of the two candidates' ``spreads`` (% of their medians). None when a
    spread is unknown (one round, NaN or None): the noise was not measured.

    Example:

    ```python
    within_noise(4.0, (6.0, 2.0))  # True: a tie
    within_noise(30.0, (6.0, 3.0))  # False: a clear win
    within_noise(30.0, (float("nan"), 3.0))  # None: the noise is unknown
    ```
    """
    if any(spread is None or pd.isna(spread) for spread in spreads):
        return None
    return gain_pct <= max(spreads)


def verdict(table: pd.DataFrame) -> str:
    """The comparison in one or two sentences: the winner against one device, a tie for
    each candidate within the round-to-round spread of the winner, and each loser's
    measured reason."""
    measured = table[table["status"] == "measured"].dropna(subset=["examples_per_s"])
    measured = measured.sort_values("examples_per_s", ascending=False)
    missing = table[table["status"] != "measured"]
    not_run = "; ".join(f"{row.candidate} {row.status}" for row in missing.itertuples())
    tail = f" Not measured: {not_run}." if not_run else ""
    if measured.empty:
        return f"No candidate was measured: see the reasons in the table.{tail}"
    winner = measured.iloc[0]
    rate = f"{winner['examples_per_s']:.0f} examples/s"
    if len(measured) == 1:
        return f"Only {winner['candidate']} was measured ({rate}).{tail}"
    head = (
        f"{winner['candidate']}: {winner['speedup']:.2f}x {BASELINE} ({rate})"
        if pd.notna(winner["speedup"]) and winner["candidate"] != BASELINE
        else f"{winner['candidate']}: {rate}"
    )
    parts = [head]
    for _, row in measured.iloc[1:].iterrows():
        gain_pct = (winner["examples_per_s"] / row["examples_per_s"] - 1) * 100
        spreads = (winner["spread_pct"], row["spread_pct"])
        if within_noise(gain_pct, spreads):  # unknown noise: a loss, said below the verdict
            noise = max(spreads)
            parts.append(
                f"{row['candidate']} is within the round-to-round spread "
                f"({winner['candidate']} is {gain_pct:.0f}% faster, rounds spread up to "
                f"{noise:.0f}%): treat the two as a tie"
            )
            continue
        ratio = row["examples_per_s"] / winner["examples_per_s"]
        parts.append(
            f"{row['candidate']} loses ({ratio:.2f}x {winner['candidate']}): "
            f"{loss_reason(row, winner)}"
        )
    text = "; ".join(parts) + "."
    if measured["spread_pct"].isna().any():
        text += (
            " With one round, the round-to-round noise is unknown: a small gap may be "
            "noise (rounds >= 2 measure it)."
        )
    return text + tail
