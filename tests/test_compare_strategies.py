"""compare_strategies: the same model under each strategy, in its own processes, on 4
logical CPUs; its table, verdict, code, record, command and plot."""

import io
import json
import math
import os
import statistics
import subprocess
import sys

import numpy as np
import pandas as pd
import psutil
import pytest

from keras_dp_tools.analysis.strategies import (
    best,
    comparison_table,
    speedup_note,
    verdict,
)
from keras_dp_tools.records.comparison import (
    comparison_path,
    comparison_record,
    read_comparison,
    write_comparison,
)
from keras_dp_tools.tools.strategies import candidates
from keras_dp_tools.tools.strategies.compare import StrategyComparison, compare_strategies
from tests.helpers import REPO
from tests.helpers.comparisons import blocks, row
from tests.helpers.doc_blocks import python_block
from tests.helpers.processes import run_cli

SCRIPT = REPO / "examples" / "compare_strategies_script.py"
FAULTS = REPO / "tests" / "jobs" / "strategy_faults.py"
# The candidates the measuring test runs.
MEASURED = [
    "one_device",
    "mirrored",
    "central_storage",
    "multi_worker_mirrored",
    "parameter_server",
]
PER_REPLICA_BATCH = 16


# -- the table and the verdict, on hand-made measurements ---------------------------------


def test_rates_are_medians_of_rounds_and_speedups_are_over_one_device():
    table = comparison_table(
        [
            row("one_device", replicas=1, blocks=blocks(10, 12, 11)),  # 100, 83.3, 90.9 /s
            row("mirrored", replicas=4, blocks=blocks(4, 5, 6)),  # 250, 200, 166.7 /s
            row("central_storage", "failed", reason="RuntimeError: no"),
            row("multi_worker_mirrored", "skipped", reason="needs tf_keras"),
        ]
    ).set_index("candidate")

    order = ["mirrored", "one_device", "central_storage", "multi_worker_mirrored"]
    assert list(table.index) == order  # measured fastest first, then failed, skipped
    assert table.loc["mirrored", "examples_per_s"] == pytest.approx(200.0)
    assert table.loc["one_device", "examples_per_s"] == pytest.approx(1000 / 11)
    assert table.loc["mirrored", "speedup"] == pytest.approx(200 / (1000 / 11))
    assert table.loc["mirrored", "step_ms"] == pytest.approx(500.0)  # 5 s / 10 steps
    assert table.loc["mirrored", "spread_pct"] == pytest.approx((250 - 1000 / 6) / 200 * 100)
    assert math.isnan(table.loc["central_storage", "speedup"])
    assert best(table.reset_index()) == "mirrored"


def test_the_verdict_names_the_winner_its_speedup_and_each_losers_measured_reason():
    table = comparison_table(
        [
            # 1000 examples in 10 steps a round: a global batch of 100.
            row("one_device", replicas=1, blocks=blocks(10, 10, 10)),  # 100 /s, 1 s a step
            row(
                "mirrored",
                replicas=4,
                blocks=blocks(4, 4, 4),  # 250 /s
                evidence={
                    "step_ms": 400.0,
                    "comm_ms": 100.0,
                    "bytes_per_step": 4.2e6,
                    "bytes_source": "model sizes",
                },
            ),
            row(
                "central_storage",
                replicas=4,
                blocks=blocks(8, 8, 8),  # 125 /s
                evidence={
                    "step_ms": 800.0,
                    "read_bytes": 3 * 5.6e6,
                    "push_bytes": 3 * 5.6e6,
                    "bytes_per_step": 6 * 5.6e6,
                    "bytes_source": "model sizes",
                    "variable_device": "/job:localhost/replica:0/task:0/device:CPU:0",
                    "variable_on_replica": True,
                    "note": "its communication time is not measured",
                },
            ),
        ]
    )
    text = verdict(table)

    assert text.startswith("mirrored: 2.50x one_device (250 examples/s)")
    assert "central_storage loses (0.50x mirrored): its variables live on CPU:0" in text
    # On one of its 4 replicas' devices: 3 replicas read the variables and push gradients.
    assert "CPU:0, one of its replicas' devices" in text
    assert "the model's size implies up to 2 × 16.8 MB a step, if copied" in text
    assert "(from model sizes)" in text
    assert "its communication time is not measured" in text  # NaN comm said, not made up
    # one_device: 100 examples a step in 1000 ms (10 s / 10 steps), mirrored 100 in 400 ms.
    assert (
        "one_device loses (0.40x mirrored): it trains 100 examples a step in 1.00 s, "
        "mirrored 100 in 400.0 ms"
    ) in text
    assert "replica against" not in text
    assert "tie" not in text


def test_communication_is_called_the_reason_only_when_it_covers_most_of_the_gap():
    # Per example: central_storage 1000 examples in 4.6 s; mirrored in 6.3 s (10 steps
    # of 100). A mirrored step of 100 examples takes 630 ms; at central_storage's rate
    # 460 ms: it is 170 ms behind. Its exposed all-reduce of 100 ms covers 100 of 170.
    def table_with_comm(comm_ms):
        return comparison_table(
            [
                row("central_storage", replicas=4, blocks=blocks(4.6, 4.6, 4.6)),
                row(
                    "mirrored",
                    replicas=4,
                    blocks=blocks(6.3, 6.3, 6.3),
                    evidence={"step_ms": 620.0, "comm_ms": comm_ms},
                ),
            ]
        )

    text = verdict(table_with_comm(60.0))
    assert "mirrored loses (0.73x central_storage)" in text
    assert (
        "its exposed all-reduce takes 60.0 ms of a 620.0 ms profiled step (10%), which "
        "accounts for 60.0 ms of the 170.0 ms a step of 100 examples is behind "
        "central_storage's rate; the rest is not attributed"
    ) in text
    text = verdict(table_with_comm(150.0))  # 150 of 170: most of the gap
    assert "which accounts for most (88%) of the 170.0 ms a step of 100 examples" in text
    assert "not attributed" not in text
    text = verdict(table_with_comm(200.0))  # more than the gap: all of it
    assert "which accounts for all of the 170.0 ms" in text


def test_a_runner_up_within_the_round_spread_is_called_a_tie():
    table = comparison_table(
        [
            row("mirrored", replicas=4, blocks=blocks(4.0, 4.4, 3.6)),  # 250 /s, spread 20%
            row("central_storage", replicas=4, blocks=blocks(4.2, 4.2, 4.2)),  # 238 /s: 5% less
        ]
    )
    text = verdict(table)
    assert text.startswith("mirrored: 250 examples/s")  # one_device not there: no speed-up
    assert "central_storage is within the round-to-round spread" in text and "tie" in text
    assert speedup_note(table) == "no speed-up: one_device was not among the candidates"


def test_every_loser_within_the_noise_is_a_tie_and_one_round_has_unknown_noise():
    three = comparison_table(
        [
            row("mirrored", replicas=4, blocks=blocks(4.0, 4.4, 3.6)),  # 250 /s, spread 20%
            row("central_storage", replicas=4, blocks=blocks(4.2, 4.2, 4.2)),  # 5% less
            row("multi_worker_mirrored", replicas=4, blocks=blocks(4.4, 4.4, 4.4)),  # 10%
            row("one_device", replicas=1, blocks=blocks(8, 8, 8)),  # 100% slower: a loss
        ]
    )
    text = verdict(three)
    assert "central_storage is within the round-to-round spread" in text
    assert "multi_worker_mirrored is within the round-to-round spread" in text
    assert "multi_worker_mirrored loses" not in text
    assert "one_device loses (0.50x mirrored)" in text

    once = comparison_table(
        [
            row("mirrored", replicas=4, blocks=blocks(4.0)),
            row("central_storage", replicas=4, blocks=blocks(4.2)),
        ]
    )
    assert once["spread_pct"].isna().all()  # one round measures no spread
    text = verdict(once)
    assert "central_storage loses" in text
    assert "the round-to-round noise is unknown" in text and "rounds >= 2" in text


def test_the_parameter_server_verdict_names_the_bytes_the_rate_and_the_share_of_the_step():
    table = comparison_table(
        [
            row("mirrored", replicas=2, blocks=blocks(1, 1, 1)),
            row(
                "parameter_server",
                replicas=2,
                blocks=blocks(6, 6, 6),
                evidence={
                    "step_ms": 1700.0,
                    "comm_ms": 1500.0,
                    "read_bytes": 94e6,
                    "push_bytes": 94e6,
                    "bytes_per_step": 188e6,
                    "bytes_source": "trace",
                },
            ),
        ]
    )
    # 188e6 bytes x 8 bits in 1.5 s = 1.0027 Gbit/s. A 100-example step: 600 ms here,
    # 100 ms at mirrored's rate: 500 ms behind, which 1.5 s of waits more than cover.
    assert (
        "parameter_server loses (0.17x mirrored): the parameter servers move 2 × 94.0 MB per "
        "step (from trace) at 1.00 Gbit/s: 1.50 s of a 1.70 s profiled step, which accounts "
        "for all of the 500.0 ms a step of 100 examples is behind mirrored's rate"
    ) in verdict(table)


def test_central_storage_bytes_count_only_the_replicas_apart_from_the_variables():
    from keras_dp_tools.tools.strategies.compare import _with_model_sizes

    cpus = [f"/job:localhost/replica:0/task:0/device:CPU:{index}" for index in range(4)]
    on_cpu = _with_model_sizes(
        "central_storage",
        {
            "replicas": 4,
            "variable_bytes": 1000,
            "variable_device": cpus[0].lower(),
            "replica_devices": cpus,
        },
        {"step_ms": 5.0},
    )
    # CPU:0 holds the variables and is replica 0's device: 3 replicas copy, 1000 B each way.
    assert (on_cpu["read_bytes"], on_cpu["push_bytes"], on_cpu["bytes_per_step"]) == (
        3000,
        3000,
        6000,
    )
    assert on_cpu["variable_on_replica"] and on_cpu["shared_memory"]
    gpus = [f"/job:localhost/replica:0/task:0/device:GPU:{index}" for index in range(2)]
    apart = _with_model_sizes(
        "central_storage",
        {
            "replicas": 2,
            "variable_bytes": 1000,
            "variable_device": cpus[0],
            "replica_devices": gpus,
        },
        {},
    )
    assert apart["bytes_per_step"] == 4000  # both GPUs read and push: 2 x 2 x 1000
    assert not apart["variable_on_replica"] and not apart["shared_memory"]


def test_one_or_no_measured_candidate_is_said_plainly():
    one = comparison_table(
        [
            row("mirrored", replicas=4, blocks=blocks(4)),
            row("one_device", "failed", reason="timed out after 30 s"),
        ]
    )
    assert verdict(one) == (
        "Only mirrored was measured (250 examples/s). Not measured: one_device failed."
    )
    assert speedup_note(one) == "no speed-up: one_device failed (timed out after 30 s)"
    none = comparison_table([row("mirrored", "failed", reason="x"), row("one_device", "skipped")])
    assert verdict(none).startswith("No candidate was measured")
    assert best(none) is None


# -- input checks, before any process starts ---------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"strategies": ["mirored"]}, "choose from one_device, mirrored, central_storage"),
        ({"steps": 0}, "steps"),
        ({"steps": 2, "rounds": 3}, "fewer than rounds"),
        ({"per_replica_batch": -1}, "per_replica_batch"),
        ({"timeout": 0}, "timeout"),
        ({"options": {"parameter_server": {}}, "strategies": ["mirrored"]}, "not among"),
        ({"options": {"mirrored": {"replicas": 0}}}, "replicas"),
    ],
)
def test_bad_arguments_are_refused_with_what_was_received(arguments, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        compare_strategies(
            f"{SCRIPT}:build_model", f"{SCRIPT}:make_dataset", log_dir=tmp_path, **arguments
        )
    assert not any(tmp_path.iterdir())  # no trial started


def test_the_command_refuses_what_the_api_refuses_as_a_usage_error(tmp_path, capsys):
    from keras_dp_tools.tools.cli import main

    def refused(*arguments):
        status = main(["compare-strategies", str(SCRIPT), *arguments])
        return status, capsys.readouterr().err

    status, error = refused("--strategies", "mirrored,ps")
    assert status == 2 and "candidate(s) ['ps']; choose from one_device" in error
    status, error = refused("--strategies", "mirrored,mirrored")
    assert status == 2 and "Each candidate once" in error
    status, error = refused("--steps", "2", "--rounds", "3")
    assert status == 2 and "fewer than rounds" in error
    status, error = refused("--option", "mirrored.replicas=0")
    assert status == 2 and "options['mirrored']['replicas'] must be a positive integer" in error
    status, error = refused("--option", "replicas=2")
    assert status == 2 and "--option CANDIDATE.KEY=VALUE" in error
    assert main(["compare-strategies", str(tmp_path / "missing.py")]) == 2


def test_an_option_from_the_command_reaches_its_candidate(tmp_path, capsys):
    from keras_dp_tools.tools.cli import main

    # MirroredStrategy over 1 device is skipped before any process starts: nothing measured.
    arguments = ["--strategies", "mirrored", "--option", "mirrored.replicas=1"]
    status = main(["compare-strategies", str(SCRIPT), *arguments, "--log-dir", str(tmp_path)])
    assert status == 1
    assert "mirrored: skipped (MirroredStrategy over 1 device" in capsys.readouterr().out
    assert read_comparison(tmp_path)["settings"]["options"]["mirrored"] == {"replicas": 1}


def test_the_steps_that_ran_are_recorded_and_a_removed_folder_is_not_pointed_to():
    result = compare_strategies(
        f"{SCRIPT}:build_model",
        f"{SCRIPT}:make_dataset",
        ["mirrored"],
        steps=10,
        rounds=3,
        options={"mirrored": {"replicas": 1}},  # skipped: no process starts
        progress=None,
    )
    assert result.settings["steps"] == 9  # 3 rounds of 10 // 3 steps
    assert result.settings["block_steps"] == 3
    assert result.log_dir is None  # the temporary folder, removed: nothing failed


def test_skip_reasons_name_what_is_missing(monkeypatch):
    cpu = candidates.Machine(gpus=(), cpu_replicas=4)
    assert candidates.skip_reason("mirrored", {"replicas": 4}, cpu) is None
    two_gpus = candidates.Machine(gpus=("0", "1"), cpu_replicas=4)
    assert candidates.skip_reason("mirrored", {"replicas": 4}, two_gpus) == (
        "needs 4 GPUs, 2 are visible"
    )
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    for name, options in (("multi_worker_mirrored", {"workers": 2}), ("parameter_server", {})):
        assert "needs tf_keras" in candidates.skip_reason(name, options, cpu), name


def test_a_model_compiled_with_steps_per_execution_is_refused_with_what_to_do(tf):
    import keras

    from keras_dp_tools.tools.strategies._strategy_trial import refuse_steps_per_execution
    from keras_dp_tools.tools.tuning.child import ContractError

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=3)
    with pytest.raises(ContractError, match=r"steps_per_execution=3.*compile\(\) without it"):
        refuse_steps_per_execution(model)
    model.compile(optimizer="sgd", loss="mse")
    refuse_steps_per_execution(model)  # 1: each step is timed


# -- the record ---------------------------------------------------------------------------


def test_the_record_is_json_with_nulls_for_unknown_numbers_and_loads_back(tmp_path):
    table = comparison_table([row("mirrored", replicas=4, blocks=blocks(4))])
    record = comparison_record(
        time="t",
        table=table.to_dict("records"),
        verdict="v",
        best="mirrored",
        code="c",
        settings={},
        versions={},
    )
    path = write_comparison(tmp_path, record)

    assert path == comparison_path(tmp_path) and path.name == "strategy_comparison.json"
    stored = json.loads(path.read_text())  # strict JSON: NaN would not parse back as null
    assert stored["table"][0]["speedup"] is None and stored["kind"] == "strategy_comparison"
    assert [p.name for p in tmp_path.iterdir()] == ["strategy_comparison.json"]  # no temp
    loaded = StrategyComparison.load(tmp_path)
    assert loaded.best == "mirrored" and loaded.table["examples_per_s"].iloc[0] == 250.0
    with pytest.raises(FileNotFoundError, match="No strategy comparison"):
        StrategyComparison.load(tmp_path / "elsewhere")
    path.write_text("{}")
    with pytest.raises(ValueError, match="not a strategy comparison record"):
        read_comparison(tmp_path)


def test_the_plot_draws_each_measured_rate_with_its_round_range():
    from keras_dp_tools.report import plots

    table = comparison_table(
        [
            row("one_device", replicas=1, blocks=blocks(10, 8, 12)),
            row("mirrored", replicas=4, blocks=blocks(4, 5, 2)),
            row("central_storage", "failed", reason="RuntimeError: no"),
        ]
    )
    comparison = StrategyComparison(table, best(table), None, verdict(table), REPO)
    figure = plots.strategy_comparison(comparison)

    axes = figure.axes[0]
    heights = [bar.get_height() for bar in axes.patches]
    assert heights == pytest.approx([250.0, 100.0])  # medians: 4 s and 10 s for 1000
    whisker = axes.collections[0].get_segments()[0]  # mirrored: 200 .. 500 examples/s
    assert whisker[:, 1] == pytest.approx([200.0, 500.0])
    assert "central_storage: failed (RuntimeError: no)" in figure._supxlabel.get_text()
    empty = comparison_table([row("mirrored", "failed", reason="x")])
    omitted = plots.strategy_comparison(StrategyComparison(empty, None, None, "", REPO))
    assert isinstance(omitted, plots.Omitted) and "mirrored: failed (x)" in str(omitted)


# -- real comparisons ---------------------------------------------------------------------


def trial_processes(log_dir) -> list:
    """Processes still running with ``log_dir`` in their command line."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if str(log_dir) in " ".join(process.info["cmdline"] or []):
            found.append(process)
    return found


@pytest.mark.slow
def test_each_candidate_is_measured_and_the_verdict_names_the_fastest(tmp_path):
    lines = []
    result = compare_strategies(
        f"{SCRIPT}:build_model",
        # Batched without drop_remainder: each epoch ends in a short batch, never trained.
        f"{FAULTS}:make_dataset_with_a_remainder",
        MEASURED,
        per_replica_batch=PER_REPLICA_BATCH,
        steps=6,
        rounds=3,
        options={"multi_worker_mirrored": {"workers": 2}},
        log_dir=tmp_path,
        progress=lines.append,
    )
    table = result.table.set_index("candidate")

    assert set(table.index) == set(MEASURED)
    for name, entry in table.iterrows():
        assert entry["status"] == "measured" or (
            entry["status"] == "skipped" and entry["reason"]
        ), (name, entry["reason"])
    measured = table[table["status"] == "measured"]
    assert {"one_device", "mirrored", "central_storage"} <= set(measured.index)
    # Replicas as each child reported them (MWMS: 2 workers, 1 CPU each; PS: 2 workers),
    # and the examples each step of a round trained: 16 a replica, never a short batch.
    expected = {
        "one_device": 1,
        "mirrored": 4,
        "central_storage": 4,
        "multi_worker_mirrored": 2,
        "parameter_server": 2,
    }
    assert measured["replicas"].to_dict() == {name: expected[name] for name in measured.index}
    assert measured["global_batch"].to_dict() == {
        name: PER_REPLICA_BATCH * expected[name] for name in measured.index
    }
    # The verdict's arithmetic, recomputed here from each candidate's rounds' rates
    # (whatever the ranking the noise gave): the table's rate and spread, the winner, its
    # speed-up, and for each other candidate a tie within the spread or a loss by its ratio.
    rates, spreads = {}, {}
    for name, entry in measured.iterrows():
        rounds = entry["round_examples_per_s"]
        rates[name] = statistics.median(rounds)
        spreads[name] = (max(rounds) - min(rounds)) / rates[name] * 100
        assert entry["examples_per_s"] == pytest.approx(rates[name])
        assert entry["spread_pct"] == pytest.approx(spreads[name])
    fastest = max(rates, key=rates.get)
    assert result.best == fastest and f"{candidates.LABELS[fastest]}(" in result.code
    if fastest != "one_device":
        speedup = rates[fastest] / rates["one_device"]
        assert result.verdict.startswith(f"{fastest}: {speedup:.2f}x one_device")
    for name in rates:
        if name == fastest:
            continue
        gain_pct = (rates[fastest] / rates[name] - 1) * 100
        if gain_pct <= max(spreads[fastest], spreads[name]):
            assert f"{name} is within the round-to-round spread" in result.verdict
        else:
            assert f"{name} loses ({rates[name] / rates[fastest]:.2f}x {fastest})" in (
                result.verdict
            )
    assert measured.loc["one_device", "comm_ms"] == 0.0  # one device: nothing to exchange
    assert measured.loc["mirrored", "comm_ms"] > 0
    assert measured.loc["mirrored", "bytes_source"] == "model sizes"
    # The model has 64x256+256 + 256x256+256 + 256+1 float32 parameters.
    model_bytes = 4 * (64 * 256 + 256 + 256 * 256 + 256 + 257)
    assert measured.loc["mirrored", "bytes_per_step"] == model_bytes
    # Its variables sit on CPU:0, replica 0's device: 3 replicas read them and push back.
    assert measured.loc["central_storage", "bytes_per_step"] == 2 * 3 * model_bytes
    assert np.isnan(measured.loc["central_storage", "comm_ms"])  # not attributable: said
    assert "not measured" in measured.loc["central_storage", "evidence_note"]
    assert any(line.startswith("round 3/3") for line in lines)
    # The record holds the same comparison.
    loaded = StrategyComparison.load(tmp_path)
    assert loaded.verdict == result.verdict and loaded.code == result.code
    assert list(loaded.table["candidate"]) == list(result.table["candidate"])
    assert trial_processes(tmp_path) == []


@pytest.mark.slow
def test_a_failing_and_a_hanging_candidate_leave_the_others_measured(tmp_path):
    from tests.jobs.strategy_faults import CENTRAL_STORAGE_ERROR

    result = compare_strategies(
        f"{FAULTS}:build_model",
        f"{FAULTS}:make_dataset",
        ["one_device", "mirrored", "central_storage"],
        per_replica_batch=PER_REPLICA_BATCH,
        steps=2,
        rounds=2,
        log_dir=tmp_path,
        progress=None,
        timeout=30,
    )
    table = result.table.set_index("candidate")

    assert table.loc["mirrored", "status"] == "measured"
    assert table.loc["central_storage", "status"] == "failed"
    assert table.loc["central_storage", "reason"] == f"RuntimeError: {CENTRAL_STORAGE_ERROR}"
    assert table.loc["one_device", "status"] == "failed"
    assert table.loc["one_device", "reason"] == "timed out after 30 s"
    assert result.best == "mirrored" and result.verdict.startswith("Only mirrored")
    assert math.isnan(table.loc["mirrored", "speedup"])
    assert trial_processes(tmp_path) == []  # the hanging one was killed


@pytest.mark.slow
def test_a_contract_error_in_the_trials_is_raised_once(tmp_path):
    # Given as a string, make_dataset is first read in the trials: every one would fail
    # alike, so the comparison raises the contract's error instead of failing each.
    with pytest.raises(TypeError, match=r"received make_dataset\(examples\)"):
        compare_strategies(
            f"{SCRIPT}:build_model",
            f"{FAULTS}:make_dataset_of_examples",
            ["one_device", "mirrored"],
            steps=2,
            rounds=2,
            log_dir=tmp_path,
            progress=None,
        )
    assert trial_processes(tmp_path) == []


@pytest.mark.slow
def test_the_command_prints_the_table_as_csv(tmp_path):
    done = run_cli(
        "compare-strategies",
        str(SCRIPT),
        "--strategies",
        "one_device",
        "--steps",
        "2",
        "--rounds",
        "2",
        "--per-replica-batch",
        "8",
        "--format",
        "csv",
        "--log-dir",
        str(tmp_path),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    table = pd.read_csv(io.StringIO(done.stdout))
    assert table["candidate"].tolist() == ["one_device"]
    assert table["status"].tolist() == ["measured"] and table["examples_per_s"].iloc[0] > 0
    assert read_comparison(tmp_path)["best"] == "one_device"


@pytest.mark.slow
def test_the_docs_example_runs_as_a_script(tmp_path):
    script = tmp_path / "compare_me.py"
    script.write_text(python_block("docs/strategies.md", "## Try it"))
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Use it with:" in done.stdout
    assert StrategyComparison.load(tmp_path / "strategies").best in ("one_device", "mirrored")
