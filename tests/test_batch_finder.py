"""find_per_replica_batch: trials in their own processes under a memory ceiling (CPU)."""

import pytest

from keras_dp_tools.tools.tuning.batch_finder import _next_batch, find_per_replica_batch

HOG = "tests.helpers.memory_hog"
MIB = 2**20
EXAMPLE_BYTES = 4 * MIB  # tests/helpers/memory_hog.py: one float32 input of 1 Mi features


def _search(mode, largest_fitting, max_batch=1024):
    trials = []
    while (batch := _next_batch(trials, mode, max_batch)) is not None:
        trials.append({"per_replica_batch": batch, "fits": batch <= largest_fitting})
    return max((t["per_replica_batch"] for t in trials if t["fits"]), default=None), trials


@pytest.mark.parametrize("largest_fitting", [0, 1, 2, 3, 5, 8, 13, 100, 511, 1024, 5000])
def test_binsearch_finds_the_exact_boundary_and_power_the_power_of_two_below(largest_fitting):
    found, trials = _search("binsearch", largest_fitting)
    capped = min(largest_fitting, 1024)
    assert found == (capped or None)
    assert len(trials) <= 2 * 11 + 1  # doubling then halving: logarithmic
    found, _ = _search("power", largest_fitting)
    expected = 2 ** (capped.bit_length() - 1) if capped else None
    assert found == expected


def test_cpu_without_a_ceiling_and_bad_modes_are_refused_with_what_to_do():
    with pytest.raises(ValueError, match="max_memory_bytes"):
        find_per_replica_batch(f"{HOG}:build_model", f"{HOG}:make_dataset", 2)
    with pytest.raises(ValueError, match="binsearch"):
        find_per_replica_batch(
            f"{HOG}:build_model", f"{HOG}:make_dataset", 2, mode="fast", max_memory_bytes=1
        )


@pytest.mark.slow
def test_under_a_ceiling_the_largest_fitting_batch_and_its_plan(tmp_path):
    found = find_per_replica_batch(
        f"{HOG}:build_model",
        f"{HOG}:make_dataset",
        2,
        max_memory_bytes=150 * MIB,
        steps=1,
        base_batch=4,
        log_dir=tmp_path,
        progress=None,
    )
    trials = found.trials.set_index("per_replica_batch")
    assert list(trials.index) == [1, 2, 4, 8][: len(trials)]
    # The last trial went over the ceiling (watchdog or peak), the others fit under it.
    assert not trials["fits"].iloc[-1] and trials["fits"].iloc[:-1].all()
    assert "ceiling" in trials["reason"].iloc[-1]
    assert (trials["peak_mib"].dropna() <= 150).all()
    assert (
        found.per_replica_batch == trials.index[-2] and found.global_batch == 2 * trials.index[-2]
    )
    # Physics: each extra example is at least its 4 MiB input, resident during the step.
    fitting = trials[trials["fits"]]
    growth = (fitting["peak_mib"].iloc[-1] - fitting["peak_mib"].iloc[0]) * MIB
    extra_examples = fitting["global_batch"].iloc[-1] - fitting["global_batch"].iloc[0]
    assert growth >= extra_examples * EXAMPLE_BYTES
    # The plan scales the optimizer's learning rate (SGD 0.01, tuned at a global 4).
    assert found.plan.global_batch == found.global_batch
    assert found.plan.target_lr == pytest.approx(0.01 * found.global_batch / 4)


@pytest.mark.slow
def test_when_even_batch_1_does_not_fit_the_result_says_so(tmp_path):
    found = find_per_replica_batch(
        f"{HOG}:build_model",
        f"{HOG}:make_dataset",
        2,
        max_memory_bytes=8 * MIB,
        steps=1,
        log_dir=tmp_path,
        progress=None,
    )
    assert found.per_replica_batch is None and found.global_batch is None and found.plan is None
    assert len(found.trials) == 1
    assert "Even a per-replica batch of 1 does not fit in 8 MiB" in found.note
