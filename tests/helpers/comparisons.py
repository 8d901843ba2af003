"""Strategy comparisons made by hand, for tests of the comparison's table, verdict,
record and views: candidates' rows from made-up rounds (``row``, ``blocks``), a whole
comparison written by the package's own writer (``write_comparison_dir``), and one with
known numbers and the cells every view must show for them (``write_known_comparison``,
``assert_known_table``). No TensorFlow, no trial processes.
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


# mirrored: rounds of 45,678 examples in 1.0, 0.9 and 1.1 s: median 45,678 examples/s,
# spread (50,753.3 - 41,525.5) / 45,678 = 20.2 %; 100 ms a step (median of 100, 90,
# 110 ms over 10 steps); its profiled step 40 ms, 10 ms of it exposed all-reduce (25.0 %),
# 330,756 bytes a step. one_device: 12,345 examples/s in every round. Speed-up of
# mirrored: 45,678 / 12,345 = 3.70.
MIRRORED = {
    "Candidate": "mirrored",
    "Strategy": "MirroredStrategy",
    "Status": "measured",
    "Replicas": "4",
    "Global batch (examples)": "4,568",  # 45,678 examples in 10 steps a round
    "Examples/s": "45,678",
    "Spread, slowest to fastest round (% of median)": "20.2",
    "Speed-up (x one_device)": "3.70",
    "Step time (ms)": "100",
    "Exposed comm, profiled step (ms)": "10",
    "Comm share of profiled step (%)": "25.0",
    "Bytes per step (source)": "330.8 kB (model sizes)",
}
ONE_DEVICE = {
    "Examples/s": "12,345",
    "Spread, slowest to fastest round (% of median)": "0",
    "Speed-up (x one_device)": "1.00",
    "Exposed comm, profiled step (ms)": "0",
    "Bytes per step (source)": "not measured",
}
CENTRAL_STORAGE = {
    "Status": "failed: RuntimeError: no",
    "Examples/s": "not measured",
    "Speed-up (x one_device)": "not measured",
}
CODE = (
    "import tensorflow as tf\nimport keras_dp_tools as kdt\n"
    "strategy = tf.distribute.MirroredStrategy(kdt.configure_devices(4))"
)


def write_known_comparison(log_dir) -> Path:
    """one_device, mirrored and a failed central_storage, with the numbers above."""
    return write_comparison_dir(
        log_dir,
        [
            row("one_device", replicas=1, blocks=blocks(1, 1, 1, examples=12_345),
                evidence={"step_ms": 20.0, "comm_ms": 0.0}),
            row("mirrored", replicas=4, blocks=blocks(1.0, 0.9, 1.1, examples=45_678),
                evidence={"step_ms": 40.0, "comm_ms": 10.0, "bytes_per_step": 330_756,
                          "bytes_source": "model sizes"}),
            row("central_storage", "failed", reason="RuntimeError: no"),
        ],
    )  # fmt: skip


def by_candidate(rows: list[list[str]]) -> dict[str, dict[str, str]]:
    """A table's rows (header first, cell texts) by the candidate they are about."""
    header, *body = rows
    return {cells[0]: dict(zip(header, cells, strict=True)) for cells in body}


def assert_known_table(rows: list[list[str]]) -> None:
    """``rows`` (a view's table of ``write_known_comparison``) show the numbers above."""
    table = by_candidate(rows)
    assert list(table) == ["mirrored", "one_device", "central_storage"]  # fastest first
    assert table["mirrored"] == MIRRORED
    assert ONE_DEVICE.items() <= table["one_device"].items()
    assert CENTRAL_STORAGE.items() <= table["central_storage"].items()
