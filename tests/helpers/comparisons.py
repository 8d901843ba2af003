"""Strategy comparisons made by hand, for tests of the comparison's table, verdict,
record and views: candidates' rows from made-up rounds (``row``, ``blocks``), and a
whole comparison written by the package's own writer (``write_comparison_dir``).
No TensorFlow, no trial processes.
"""

from __future__ import annotations

from pathlib import Path

from keras_dp_tools.analysis.strategies import best, candidate_row, comparison_table, verdict
from keras_dp_tools.records.comparison import comparison_record, write_comparison
from keras_dp_tools.tools.strategies import candidates

CPU_MACHINE = candidates.Machine(gpus=(), cpu_replicas=4)


def blocks(*seconds, examples=1000, steps=10) -> list[dict]:
    """One timed round per ``seconds``, of ``examples`` examples in ``steps`` steps."""
    return [{"steps": steps, "examples": examples, "seconds": s} for s in seconds]


def row(name, status="measured", **kwargs) -> dict:
    """A candidate's row (``analysis.strategies.candidate_row``) under its own label."""
    return candidate_row(name, candidates.LABELS[name], status, **kwargs)


def write_comparison_dir(log_dir, rows, options=None, settings=None) -> Path:
    """Writes the comparison of ``rows`` to ``log_dir/strategy_comparison.json`` as
    ``compare_strategies`` does: its table, verdict, winner and the winner's code (on 4
    logical CPUs); returns the path."""
    table = comparison_table(rows)
    winner = best(table)
    options = {"mirrored": {"replicas": 4}, "central_storage": {"replicas": 4}, **(options or {})}
    code = candidates.code(winner, options.get(winner, {}), CPU_MACHINE) if winner else None
    record = comparison_record(
        time="2026-12-02T07:00:00+00:00",
        table=table.to_dict("records"),
        verdict=verdict(table),
        best=winner,
        code=code,
        settings={
            "steps": 30,
            "rounds": 3,
            "per_replica_batch": 32,
            "cpu_devices": 4,
            **(settings or {}),
        },
        versions={},
    )
    return write_comparison(log_dir, record)
