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
    examples_per_s = statistics.median(rates) if rates else math.nan
    spread = (max(rates) - min(rates)) / examples_per_s * 100 if rates else math.nan
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
    table["replicas"] = table["replicas"].astype("Int64")  # empty where not measured
    return table[[*TABLE_COLUMNS, "evidence"]]


def table_from_record(record: dict) -> pd.DataFrame:
    """The table a ``strategy_comparison.json`` record holds
    (``keras_dp_tools.records.comparison``), typed as ``comparison_table`` returns it:
    the numbers as float (NaN where the record has null), ``replicas`` as Int64."""
    table = pd.DataFrame(record["table"], columns=None if record["table"] else TABLE_COLUMNS)
    for column in NUMBER_COLUMNS:
        table[column] = pd.to_numeric(table[column]).astype(float)
    table["replicas"] = pd.to_numeric(table["replicas"]).astype("Int64")
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


def loss_reason(row: pd.Series, winner: pd.Series) -> str:
    """The measured reason ``row`` is slower than ``winner``, from its own evidence."""
    evidence = row["evidence"] if isinstance(row["evidence"], dict) else {}
    source = f" (from {row['bytes_source']})" if isinstance(row["bytes_source"], str) else ""
    step_ms = evidence.get("step_ms", row["step_ms"])
    has_comm = pd.notna(row["comm_ms"])
    has_bytes = pd.notna(row["bytes_per_step"])
    if row["candidate"] == "parameter_server" and has_bytes:
        moved = _moves(evidence, row["bytes_per_step"])
        text = f"the parameter servers move {moved} per step{source}"
        if has_comm and row["comm_ms"] > 0:
            gbits = row["bytes_per_step"] * 8 / (row["comm_ms"] / 1000) / 1e9
            text += f" at {gbits:.2f} Gbit/s: {_ms(row['comm_ms'])} of a {_ms(step_ms)} step"
        return text
    if row["candidate"] == "central_storage" and has_bytes:
        # "/job:localhost/replica:0/task:0/device:CPU:0" -> "CPU:0"
        where = str(evidence.get("variable_device") or "one device").rsplit("device:", 1)[-1]
        text = (
            f"its variables live on {where} and each step moves "
            f"{_moves(evidence, row['bytes_per_step'])} to and from the replicas{source}"
        )
        if has_comm:
            return text + f": {_ms(row['comm_ms'])} of a {_ms(step_ms)} step"
        note = row["evidence_note"] if isinstance(row["evidence_note"], str) else None
        return text + (f"; {note}" if note else "")
    if row["candidate"] == BASELINE:
        return (
            f"it has 1 replica against {int(winner['replicas'])}, and no communication to save"
            if pd.notna(winner["replicas"]) and winner["replicas"] > 1
            else "it has no communication to save"
        )
    if has_comm:
        share = f" ({row['comm_share']:.0%})" if pd.notna(row["comm_share"]) else ""
        return (
            f"its exposed all-reduce takes {_ms(row['comm_ms'])} of a {_ms(step_ms)} "
            f"step{share}" + (f", {_mb(row['bytes_per_step'])} a step{source}" if has_bytes else "")
        )
    note = row["evidence_note"]
    return (
        f"where its time goes was not measured ({note})"
        if isinstance(note, str)
        else ("where its time goes was not measured")
    )


def verdict(table: pd.DataFrame) -> str:
    """The comparison in one or two sentences: the winner against one device, a tie
    when the runner-up is within the round-to-round spread, and each loser's reason."""
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
    runner_up = measured.iloc[1]
    gain_pct = (winner["examples_per_s"] / runner_up["examples_per_s"] - 1) * 100
    noise = max(_spread(winner), _spread(runner_up))
    parts = [head]
    if gain_pct <= noise:
        parts.append(
            f"{runner_up['candidate']} is within the round-to-round spread "
            f"({winner['candidate']} is {gain_pct:.0f}% faster, rounds spread up to "
            f"{noise:.0f}%): treat the two as a tie"
        )
        losers = measured.iloc[2:]
    else:
        losers = measured.iloc[1:]
    for _, row in losers.iterrows():
        ratio = row["examples_per_s"] / winner["examples_per_s"]
        parts.append(
            f"{row['candidate']} loses ({ratio:.2f}x {winner['candidate']}): "
            f"{loss_reason(row, winner)}"
        )
    return "; ".join(parts) + "." + tail


def _spread(row: pd.Series) -> float:
    return float(row["spread_pct"]) if pd.notna(row["spread_pct"]) else 0.0
