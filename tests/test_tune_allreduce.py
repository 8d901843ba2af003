"""tune_allreduce: candidates in their own processes, measured in turns, on 2 logical CPUs."""

import pytest

from keras_dp_tools.tools.tuning.allreduce import CANDIDATES, tune_allreduce
from keras_dp_tools.tools.tuning.child import function_reference, load_function
from tests.helpers import REPO

SCRIPT = REPO / "examples" / "tune_allreduce_script.py"


def test_function_references_name_importable_functions(tf):
    reference = function_reference(tune_allreduce)
    assert reference == "keras_dp_tools.tools.tuning.allreduce:tune_allreduce"
    assert load_function(reference) is tune_allreduce
    script_function = load_function(f"{SCRIPT}:build_model")
    assert script_function.__name__ == "build_model"


@pytest.mark.parametrize("function", [lambda: None, "no_colon_here"])
def test_functions_a_child_cannot_import_are_refused_with_the_way_out(function):
    with pytest.raises(ValueError, match="module"):
        function_reference(function)


def test_unknown_candidates_are_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="reduction_to_one_device"):
        tune_allreduce(f"{SCRIPT}:build_model", f"{SCRIPT}:make_dataset", candidates=["fast"])


def _strategy_from(code: str):
    """Executes the code here (the session's CPUs are already split, so its
    configure_devices(2) takes two of them) and reports what the strategy holds."""
    namespace = {}
    exec(code, namespace)
    strategy = namespace["strategy"]
    ops = strategy.extended._cross_device_ops
    options = getattr(ops, "_options", None)
    return [
        type(ops).__name__,
        strategy.num_replicas_in_sync,
        getattr(options, "bytes_per_pack", None),
    ]


@pytest.mark.slow
def test_tune_allreduce_measures_candidates_in_turns_and_skips_gpu_only_ones(tmp_path, tf):
    lines = []
    result = tune_allreduce(
        f"{SCRIPT}:build_model",
        f"{SCRIPT}:make_dataset",
        devices=2,
        steps=6,
        rounds=2,
        per_replica_batch=16,
        candidates=[
            "collective_pack_1mib",
            "reduction_to_one_device",
            "nccl_packs_1",
            "hierarchical_copy_packs_1",
        ],
        log_dir=tmp_path,
        progress=lines.append,
    )
    table = result.table.set_index("candidate")
    assert table.loc["nccl_packs_1", "status"] == "skipped"
    assert "needs GPUs" in table.loc["hierarchical_copy_packs_1", "reason"]
    measured = table[table["status"] == "measured"]
    assert set(measured.index) == {"collective_pack_1mib", "reduction_to_one_device"}
    assert (measured["step_ms"] > 0).all() and (measured["allreduce_ms"] > 0).all()
    # Each child really ran the strategy its code builds (reported from inside it).
    assert table.loc["reduction_to_one_device", "cross_device_ops"] == "ReductionToOneDevice"
    assert table.loc["collective_pack_1mib", "cross_device_ops"] == "CollectiveAllReduce"
    # The default (collective) was not asked for: the fastest is named, and the note
    # says it is no win over the default.
    assert result.best == measured["step_ms"].idxmin()
    assert result.best in result.note and "default (collective) was not measured" in result.note
    assert any(line.startswith("round 2/2") for line in lines)
    # .code builds a MirroredStrategy with the recommended candidate's cross-device ops.
    expected = {
        "collective_pack_1mib": ["CollectiveAllReduce", 2, 1024 * 1024],
        "reduction_to_one_device": ["ReductionToOneDevice", 2, None],
    }[result.best]
    assert _strategy_from(result.code) == expected
    assert "tf.distribute.MirroredStrategy(" in result.code
    assert CANDIDATES[result.best].cross_device_ops in result.code


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("collective", ["CollectiveAllReduce", 2, 0]),
        ("collective_pack_32mib", ["CollectiveAllReduce", 2, 32 * 1024 * 1024]),
        ("reduction_to_one_device", ["ReductionToOneDevice", 2, None]),
    ],
)
def test_each_candidates_code_builds_a_mirrored_strategy_with_its_ops(name, expected, tf):
    assert _strategy_from(CANDIDATES[name].code("kdt.configure_devices(2)")) == expected


def test_the_command_refuses_a_missing_script_with_a_clear_error(tmp_path, capsys):
    from keras_dp_tools.tools.cli import main

    assert main(["tune-allreduce", str(tmp_path / "missing.py")]) == 2
    assert "Expected a .py script" in capsys.readouterr().err


def test_devices_become_code_that_creates_them():
    from keras_dp_tools.tools.tuning.allreduce import _devices_expression

    assert _devices_expression(2) == "kdt.configure_devices(2)"
    assert _devices_expression(["/cpu:0", "/cpu:1"]) == "kdt.configure_devices(2)"
    assert _devices_expression(["/gpu:0", "/gpu:1"]) == "['/gpu:0', '/gpu:1']"
    with pytest.raises(ValueError, match="/cpu:0"):
        _devices_expression(["/cpu:1", "/cpu:3"])


def test_a_candidate_that_failed_after_it_was_ready_keeps_its_cross_device_ops(tmp_path):
    from keras_dp_tools.tools.tuning.allreduce import _outcome_rows
    from keras_dp_tools.tools.tuning.rounds import Outcome

    outcome = Outcome(
        ready={"nccl": {"cross_device_ops": "NcclAllReduce", "replicas": 2}},
        failures={"nccl": "RuntimeError: out of memory", "hierarchical_copy": "timed out"},
    )
    rows = {name: {"candidate": name} for name in ("nccl", "hierarchical_copy")}
    _outcome_rows(rows, outcome, tmp_path)
    assert rows["nccl"] == {
        "candidate": "nccl",
        "status": "failed",
        "reason": "RuntimeError: out of memory",
        "cross_device_ops": "NcclAllReduce",  # what it was ready with, before it failed
    }
    assert "cross_device_ops" not in rows["hierarchical_copy"]  # never ready: unknown


def _measured(*rows):
    import pandas as pd

    return pd.DataFrame(rows, columns=["candidate", "step_ms", "spread_pct"])


def test_a_win_within_the_spread_keeps_the_default_in_the_verdict_and_the_code():
    from keras_dp_tools.tools.tuning.allreduce import _decision

    # 10.0 vs 10.4 ms: 4% ahead of the default, rounds spread up to 6%: no clear win.
    best, note = _decision(
        _measured(("reduction_to_one_device", 10.0, 6.0), ("collective", 10.4, 2.0))
    )
    assert best == "collective"
    assert "keep MirroredStrategy's default" in note and "ReductionToOneDevice" not in note
    # 10.0 vs 13.5 ms: 35% ahead of the default, spreads 6% and 3%: a clear win.
    best, note = _decision(
        _measured(
            ("reduction_to_one_device", 10.0, 6.0),
            ("collective_pack_1mib", 13.0, 3.0),
            ("collective", 13.5, 3.0),
        )
    )
    assert best == "reduction_to_one_device" and "a clear win" in note


def test_two_candidates_that_tie_with_each_other_still_beat_a_much_slower_default():
    from keras_dp_tools.tools.tuning.allreduce import _decision

    best, note = _decision(
        _measured(
            ("collective_pack_32mib", 10.0, 2.0),
            ("collective_pack_1mib", 10.1, 2.0),  # within the spread of the fastest
            ("collective", 20.0, 2.0),  # 2x slower: clearly beaten
        )
    )
    assert best == "collective_pack_32mib" and "2.00x faster than the default" in note


def test_a_default_not_measured_is_not_recommended_and_unknown_noise_keeps_it():
    from keras_dp_tools.tools.tuning.allreduce import _decision

    best, note = _decision(
        _measured(("reduction_to_one_device", 10.0, 5.0), ("collective_pack_1mib", 10.2, 5.0))
    )
    assert best == "reduction_to_one_device" and "was not measured" in note
    # One round: no spread measured (None or NaN), whichever candidate lacks it.
    for spreads in ((None, 0.0), (0.0, float("nan"))):
        best, note = _decision(
            _measured(
                ("reduction_to_one_device", 10.0, spreads[0]), ("collective", 15.0, spreads[1])
            )
        )
        assert best == "collective" and "noise is unknown" in note
