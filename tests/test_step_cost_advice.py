"""The too-little-work and input-not-scaling findings on hand-written step breakdowns:
each expected number is worked out here from the rows, not read from the analyzer."""

import pandas as pd

from keras_dp_tools.analysis.step_cost_advice import (
    python_input_findings,
    step_costs,
    work_findings,
)


def _profiled(**parts) -> pd.DataFrame:
    """Three profiled steps whose medians are ``parts``, the middle one those values."""
    rows = []
    for scale in (0.9, 1.0, 1.2):
        rows.append({name: value * scale for name, value in parts.items()})
    return pd.DataFrame(rows)


def _header(**fields) -> pd.Series:
    base = {
        "replicas": 4,
        "global_batch": 64,
        "keras_package": "keras",
        "input_kind": "arrays",
        "input_python": [],
        "input_workers": None,
        "input_multiprocessing": None,
    }
    return pd.Series({**base, **fields})


# A tiny model: 4 ms of compute in a 20 ms step; the all-reduce exposed 4 ms, of which
# 1 ms transfer; 10.5 ms of dispatch and gaps; 0.5 ms waiting for input.
TINY = dict(
    trace_step_ms=20.0,
    compute_ms=4.0,
    exposed_allreduce_ms=4.0,
    exposed_transfer_ms=1.0,
    input_ms=0.5,
    other_ms=10.5,
)


def test_too_little_work_fires_with_the_fixed_costs_it_explains():
    costs = step_costs(_profiled(**TINY))

    (finding,) = work_findings(_header(), costs)

    assert finding.code == "too-little-work"
    assert finding.explains_ms_per_step == (4.0 - 1.0) + 10.5  # latency + other
    assert "16 examples" in finding.evidence  # 64 over 4 replicas
    assert "batch_size = 64 * strategy.num_replicas_in_sync" in finding.fix
    assert "steps_per_execution" not in finding.fix  # Keras 3 under MirroredStrategy


def test_tf_keras_fix_offers_steps_per_execution():
    (finding,) = work_findings(_header(keras_package="tf_keras"), step_costs(_profiled(**TINY)))

    assert "steps_per_execution" in finding.fix


def test_near_miss_compute_over_half_the_step():
    # The same fixed costs next to 30 ms of compute: 30 / 45.5 = 66% of the step.
    heavy = {**TINY, "compute_ms": 30.0, "trace_step_ms": 45.5}

    assert work_findings(_header(), step_costs(_profiled(**heavy))) == []


def test_near_miss_transfer_bound_is_not_too_little_work():
    # Gradients on a slow link: 40 ms of transfer outweigh 13.5 ms of fixed costs.
    link = {**TINY, "exposed_allreduce_ms": 43.0, "exposed_transfer_ms": 40.0, "trace_step_ms": 58}

    assert work_findings(_header(), step_costs(_profiled(**link))) == []


def test_one_replica_is_not_too_little_work():
    assert work_findings(_header(replicas=1), step_costs(_profiled(**TINY))) == []


def test_python_input_names_the_producer_instead_of_too_little_work():
    header = _header(
        input_kind="py_dataset",
        input_python=["Rows.__getitem__"],
        input_workers=4,
        input_multiprocessing=False,
    )
    costs = step_costs(_profiled(**TINY))

    assert work_findings(header, costs) == []
    (finding,) = python_input_findings(header, costs)
    assert finding.code == "input-not-scaling"
    assert finding.explains_ms_per_step == 0.5 + 10.5  # input waits + host gaps
    assert "Rows.__getitem__" in finding.evidence and "4 threads" in finding.evidence
    assert "use_multiprocessing=True" in finding.fix


def test_generator_fix_does_not_suggest_prefetch_alone():
    header = _header(input_kind="tf.data", input_python=["Dataset.from_generator"])

    (finding,) = python_input_findings(header, step_costs(_profiled(**TINY)))

    assert "prefetch after a generator adds no parallelism" in finding.fix


def test_near_miss_python_input_that_keeps_up():
    # Python feeds the run, but the replicas compute 30 ms against 11 ms on the host.
    header = _header(input_kind="tf.data", input_python=["map(tf.py_function)"])
    heavy = {**TINY, "compute_ms": 30.0, "trace_step_ms": 45.5}

    assert python_input_findings(header, step_costs(_profiled(**heavy))) == []


def test_no_python_input_no_input_finding():
    assert python_input_findings(_header(), step_costs(_profiled(**TINY))) == []


def test_a_custom_loops_form_gives_a_loops_fix():
    (finding,) = work_findings(_header(), step_costs(_profiled(**TINY)), custom_loop=True)

    assert finding.code == "loop-host-sync"
    assert finding.explains_ms_per_step == (4.0 - 1.0) + 10.5
    assert "tf.range" in finding.fix and "every N steps" in finding.fix
    assert "steps_per_execution" not in finding.fix  # a custom loop has no compile()


def test_the_predicted_gain_is_in_the_evidence():
    (finding,) = work_findings(_header(), step_costs(_profiled(**TINY)), larger_batch_gain=2.46)

    assert "at 64 examples per replica what_if predicts 2.5x the examples/s." in finding.evidence
