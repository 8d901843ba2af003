"""The demo's log dir served by a real `tensorboard --logdir` on loopback shows our scalars."""

from collections import Counter

import pytest

from tests.helpers.processes import get_json


@pytest.mark.slow
def test_tensorboard_lists_our_scalars_and_profiles(demo_tensorboard):
    base, log_dir = demo_tensorboard
    tags = get_json(f"{base}/data/plugin/scalars/tags")
    plugins = get_json(f"{base}/data/plugins_listing")
    profile_runs = get_json(f"{base}/data/plugin/profile/runs")

    ours = tags.get("keras_dp/worker-0", {})
    assert {"dp/step_ms", "dp/examples_per_s", "dp/step_ms_disturbed"} <= set(ours)
    # Few tags per group (TensorBoard shows a section per first path part), and the
    # breakdown apart from the continuous series, saying so on the chart.
    groups = Counter(tag.split("/")[0] for tag in ours)
    assert set(groups) == {"dp", "dp_window", "dp_window_other", "host"}  # no GPU here
    assert max(groups.values()) <= 10
    assert "profiled steps only" in ours["dp_window/compute_ms"]["description"]
    assert "not epochs" in ours["dp/step_ms"]["description"]
    assert "train" in tags  # Keras's own TensorBoard callback, side by side
    assert "profile" in plugins  # tensorboard-plugin-profile is installed for the Profile tab
    # The Profile tab lists our profiler windows, named "<capture> (<log dir subfolder>)" or
    # "train/<capture>" depending on the plugin version.
    captures = {path.parent.name for path in log_dir.glob("train/plugins/profile/*/*.xplane.pb")}
    assert len(captures) == 3
    assert all(any(capture in str(run) for run in profile_runs) for capture in captures)


@pytest.mark.slow
def test_headline_scalars_leave_out_what_the_summary_leaves_out(demo_run):
    """dp/step_ms holds the steps Report.summary() times; warm-up and profiled steps
    are in dp/step_ms_disturbed; host CPU is the records' reading (100 per core) over
    the core count."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    import keras_dp_tools as kdt

    log_dir, _ = demo_run
    accumulator = EventAccumulator(str(log_dir / "keras_dp" / "worker-0"), {"tensors": 0})
    accumulator.Reload()

    def points(tag):
        return {e.step: make_ndarray(e.tensor_proto).item() for e in accumulator.Tensors(tag)}

    steps = kdt.Report.load(log_dir).steps
    excluded = steps["warmup"] | steps["profiled"]
    assert set(points("dp/step_ms")) == set(steps.loc[~excluded, "step"])
    assert set(points("dp/step_ms_disturbed")) == set(steps.loc[excluded, "step"])
    cpu = kdt.Report.load(log_dir).cpu.dropna(subset=["process_cpu_percent"])
    host = [
        make_ndarray(e.tensor_proto).item() for e in accumulator.Tensors("host/cpu_process_percent")
    ]
    expected = cpu["process_cpu_percent"] / cpu["cpu_count"]
    assert sorted(host) == pytest.approx(sorted(expected), rel=1e-5)
    assert min(host) >= 0 and max(host) <= 100.0
