"""One job, one run: workers started by hand agree on their run id; the report finds and
merges workers of one job recorded under separate ids, and says what does not fit.

The slow tests start real tf_keras workers the way TensorFlow's multi-worker tutorial
does (each its own TF_CONFIG, nothing else shared); the cases of bad input are copies
of their records, edited as a leftover file, a skewed clock or a missing worker would
leave them.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

import keras_dp_tools as kdt
from keras_dp_tools.analysis import jobs
from keras_dp_tools.analysis.record_tables import records_by_type
from keras_dp_tools.capture import job_identity
from keras_dp_tools.capture.job_identity import (
    JobId,
    cluster_fingerprint,
    given_job_id,
    job_id_for,
    next_run_id,
)
from keras_dp_tools.records.writer import records_dir
from tests.helpers import REPO
from tests.helpers.processes import TRAIN_JOB, run_cli, run_workers_by_hand
from tests.helpers.recorded_runs import BALANCED, write_run

# Worker 1 sleeps 40 ms before each step; worker 0 profiles steps 3-7.
STRAGGLER = ("--slow-worker", "1", "--slow-ms", "40", "--profile-start-step", "3")
TINY = ("--epochs", "1", "--steps-per-epoch", "16")


# -- choosing the id: pure rules on given environments ---------------------------------


def test_the_run_id_env_overrides_everything_also_for_one_worker():
    environ = {"KERAS_DP_RUN_ID": "exp-1", "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0"}
    assert given_job_id(environ, "node1", workers=2) == ("exp-1", "env")
    assert given_job_id({"KERAS_DP_RUN_ID": "exp-1"}, "node1", workers=1) == ("exp-1", "env")


def test_slurm_gives_job_and_step_and_only_to_multi_worker_jobs():
    step = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "3"}
    assert given_job_id(step, "node7", workers=2) == ("slurm-4242.3", "slurm")
    # Started by the batch script itself (no srun: no step): two jobs of one allocation
    # would share the job id, so the workers agree on one instead.
    assert given_job_id({"SLURM_JOB_ID": "4242"}, "node7", workers=4) is None
    assert given_job_id({"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": ""}, "n7", workers=4) is None
    # One worker (e.g. a sweep's runs inside one allocation) keeps an id of its own.
    assert given_job_id(step, "node7", workers=1) is None


def pods(name: str, workers: int, domain: str = ".svc") -> dict[str, list[str]]:
    """The cluster of an Indexed Job's pods (``<name>-<index>.<subdomain>:port``)."""
    return {"worker": [f"{name}-{index}{domain}:2222" for index in range(workers)]}


def test_a_kubernetes_indexed_job_is_named_from_the_pod_hostname():
    environ = {"JOB_COMPLETION_INDEX": "12"}
    cluster = pods("bert-train", 16)
    assert given_job_id(environ, "bert-train-12", 16, cluster) == ("k8s-bert-train", "kubernetes")
    assert given_job_id(environ, "bert-train-12", 16, pods("bert-train", 16, domain="")) == (
        "k8s-bert-train",
        "kubernetes",
    )
    # A hostname Kubernetes did not derive from the index: no rule applies.
    assert given_job_id(environ, "bert-train-3", 16, cluster) is None
    assert given_job_id(environ, "12", 16, cluster) is None
    # A name at the DNS label limit may have been cut short: not trusted.
    assert given_job_id(environ, "x" * 60 + "-12", 16, pods("x" * 60, 16)) is None
    assert given_job_id({}, "bert-train-12", 16, cluster) is None
    # No cluster to check the pods against: not trusted.
    assert given_job_id(environ, "bert-train-12", 16) is None


def test_a_cluster_over_the_child_jobs_of_a_jobset_is_not_named_after_one_of_them():
    # A JobSet "js" with 2 child Jobs js-workers-0 and js-workers-1 of 2 pods each:
    # pod js-workers-1-0 runs in Job js-workers-1 with JOB_COMPLETION_INDEX 0. Named
    # after its own Job, the 4 workers of one TF cluster would get 2 ids.
    cluster = {"worker": [f"js-workers-{job}-{pod}.js:2222" for job in (0, 1) for pod in (0, 1)]}
    environ = {"JOB_COMPLETION_INDEX": "0"}
    assert given_job_id(environ, "js-workers-1-0", 4, cluster) is None
    assert given_job_id(environ, "js-workers-0-0", 4, cluster) is None
    # A Job whose name another's begins with: its pods' names are not "<name>-<index>".
    assert given_job_id(environ, "train-0", 2, pods("train-eval", 2)) is None
    # One child Job that is the whole cluster keeps its name.
    one_job = {"worker": cluster["worker"][2:]}
    assert given_job_id(environ, "js-workers-1-0", 2, one_job) == ("k8s-js-workers-1", "kubernetes")


def test_the_cluster_fingerprint_is_the_same_for_every_worker_and_differs_by_address():
    cluster = {"worker": ["localhost:2001", "localhost:2002"]}
    shuffled = {"worker": ["localhost:2002", "localhost:2001"]}
    assert cluster_fingerprint(cluster) == cluster_fingerprint(shuffled)
    assert cluster_fingerprint(cluster) != cluster_fingerprint(
        {"worker": ["localhost:2001", "localhost:2003"]}
    )
    assert cluster_fingerprint({"worker": ["localhost:2001"]}) is None
    assert cluster_fingerprint(None) is None


def test_later_runs_of_a_shared_id_are_numbered_the_same_on_every_worker():
    job = JobId("job-9", "agreed", "abc")
    assert [next_run_id(job, started) for started in range(3)] == ["job-9", "job-9.2", "job-9.3"]
    local = JobId(None, "local")
    assert next_run_id(local, 0) != next_run_id(local, 0)  # fresh ids, never shared


def two_worker_strategy(spec: dict) -> SimpleNamespace:
    """What ``strategy_cluster`` reads of a multi-worker strategy: its resolver's spec."""
    resolver = SimpleNamespace(
        task_type="worker",
        cluster_spec=lambda: SimpleNamespace(as_dict=lambda: spec),
    )
    return SimpleNamespace(cluster_resolver=resolver)


def test_a_sparse_cluster_spec_gives_its_addresses_not_its_task_indexes():
    # ClusterSpec.as_dict() gives a job of sparse tasks as {task index: address}.
    sparse = two_worker_strategy({"worker": {0: "train-0.t:2222", 2: "train-2.t:2222"}})
    assert job_identity.strategy_cluster(sparse) == {"worker": ["train-0.t:2222", "train-2.t:2222"]}
    environ = {"JOB_COMPLETION_INDEX": "2"}
    cluster = job_identity.strategy_cluster(sparse)
    assert given_job_id(environ, "train-2", 2, cluster) == ("k8s-train", "kubernetes")


def test_a_failed_agreement_warns_once_and_falls_back_to_a_local_id(monkeypatch, tf):
    # A multi-worker cluster spec in a process without TensorFlow's coordination
    # service: the store refuses (FailedPrecondition), as it would on a cluster where
    # it is off. The fit must carry on with an id of its own. (``tf``: the session's
    # devices are set up before the store starts TensorFlow's context.)
    monkeypatch.delenv("KERAS_DP_RUN_ID", raising=False)
    monkeypatch.setattr(job_identity._Agreement, "warned", False)
    monkeypatch.setattr(job_identity._Agreement, "outcomes", {})
    spec = {"worker": ["localhost:1", "localhost:2"]}
    strategy = two_worker_strategy(spec)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = job_id_for(strategy, workers=2, environ={})
        second = job_id_for(strategy, workers=2, environ={})

    assert first == second == JobId(None, "local", cluster_fingerprint(spec))
    ours = [w for w in caught if issubclass(w.category, kdt.MeasurementWarning)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    assert "Coordination service" in str(ours[0].message)
    assert "merge_runs='detected'" in str(ours[0].message)


def test_an_agreement_with_no_answer_times_out_once_and_falls_back_to_a_local_id(monkeypatch):
    # A store that never answers (a peer that never starts the service): the worker
    # waits AGREEMENT_TIMEOUT_S once, warns once, and its later fits do not wait again.
    monkeypatch.delenv("KERAS_DP_RUN_ID", raising=False)
    monkeypatch.setattr(job_identity._Agreement, "warned", False)
    monkeypatch.setattr(job_identity._Agreement, "outcomes", {})
    monkeypatch.setattr(job_identity, "AGREEMENT_TIMEOUT_S", 0.3)
    answer = threading.Event()
    asked = []

    def never_answers(key):
        asked.append(key)
        answer.wait(30)
        return "too-late"

    monkeypatch.setattr(job_identity, "agree_through_coordination_service", never_answers)
    spec = {"worker": ["localhost:1", "localhost:2"]}
    strategy = two_worker_strategy(spec)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            started = time.perf_counter()
            first = job_id_for(strategy, workers=2, environ={})
            first_s = time.perf_counter() - started
            started = time.perf_counter()
            second = job_id_for(strategy, workers=2, environ={})
            second_s = time.perf_counter() - started
    finally:
        answer.set()  # lets the abandoned thread end

    assert first == second == JobId(None, "local", cluster_fingerprint(spec))
    assert first_s >= 0.3  # it did wait for the store
    assert second_s < 0.3 and len(asked) == 1  # and did not ask again
    ours = [w for w in caught if issubclass(w.category, kdt.MeasurementWarning)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    assert "TimeoutError: no answer in 0.3 s" in str(ours[0].message)


# -- real workers started by hand --------------------------------------------------------


def start_job(log_dir: Path, workers: int, *args: str) -> Path:
    results = run_workers_by_hand(
        TRAIN_JOB, str(log_dir), *args, workers=workers, env={"PYTHONPATH": str(REPO)}
    )
    for index, result in enumerate(results):
        assert result.returncode == 0, f"worker {index}: {result.stderr[-3000:]}"
    return log_dir


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory) -> Path:
    return start_job(tmp_path_factory.mktemp("two") / "logs", 2, *STRAGGLER, *TINY)


@pytest.fixture(scope="module")
def three_workers(tmp_path_factory) -> Path:
    return start_job(tmp_path_factory.mktemp("three") / "logs", 3, *STRAGGLER, *TINY)


def check_one_job_with_a_straggler(report: kdt.Report, workers: int) -> None:
    """What issue 26 found wrong on hand-started workers, checked right."""
    assert report.runs["run"].nunique() == 1, report.runs.to_string()
    assert sorted(report.runs["worker"]) == list(range(workers))
    steps = report.steps
    profiled = steps[(steps["worker"] == 0) & steps["trace_step_ms"].notna()]
    assert len(profiled) >= 3, report.windows.to_string()
    # Worker 0 waited ~40 ms for worker 1 in each step: waiting, not transfer.
    assert profiled["sync_wait_ms"].median() >= 25
    own = steps[(steps["worker"] == 1) & steps["step"].isin(profiled["step"])]
    assert profiled["transfer_ms"].median() <= 1.5 * own["step_ms"].median() + 2.0
    assert "Worker 1 is a straggler" in [item.title for item in report.advice()], report.text()
    assert not [item for item in report.job_findings() if item.code != "merged-runs"]


@pytest.mark.slow
def test_two_workers_started_by_hand_record_one_run_and_what_if_works(two_workers):
    report = kdt.Report.load(two_workers)

    check_one_job_with_a_straggler(report, workers=2)
    assert set(report.runs["run_id_source"]) == {"agreed"}
    assert report.runs["cluster"].nunique() == 1
    table = kdt.what_if(two_workers, workers=4)
    assert table["run"].tolist() == report.runs["run"].unique().tolist()
    assert table["step_ms"].iloc[0] > 0


@pytest.mark.slow
def test_three_workers_started_by_hand_record_one_run_and_what_if_works(three_workers):
    report = kdt.Report.load(three_workers)

    check_one_job_with_a_straggler(report, workers=3)
    workers = report.workers.set_index("worker")
    assert workers.loc[[0, 2], "median_worker_wait_ms"].min() >= 25  # both waited for 1
    assert len(kdt.what_if(three_workers)) == 1


@pytest.mark.slow
def test_the_agreement_costs_each_worker_under_50_ms_once(two_workers, three_workers):
    runs = pd.concat([kdt.Report.load(d).runs for d in (two_workers, three_workers)])
    cost = runs["run_id_agreement_ms"]
    print(f"run id agreement per worker (ms): {cost.round(2).tolist()}")
    assert cost.notna().all() and len(cost) == 5
    # 1-35 ms seen on this 2-core machine shared with other test runs. The goal is 50
    # ms; the bound keeps margin.
    assert cost.median() < 50, cost.tolist()
    assert cost.max() < 100, cost.tolist()


@pytest.mark.slow
def test_the_agreement_runs_once_per_process_for_all_its_fits(tmp_path):
    # Each worker runs two fits, the second at another global batch: two runs, the
    # second numbered from the agreed id without asking again.
    log_dir = start_job(tmp_path / "logs", 2, *TINY, "--second-fit")

    runs = kdt.Report.load(log_dir).runs.sort_values(["worker", "time"])

    first, second = sorted(runs["run"].unique(), key=len)
    assert second == f"{first}.2"
    assert set(runs["run_id_source"]) == {"agreed"}
    assert runs["global_batch"].tolist() == [16, 8, 16, 8]
    # Per worker, both runs carry the one measurement of its one agreement: asked
    # again, the second fit would have timed a second one.
    for worker, rows in runs.groupby("worker"):
        cost = rows["run_id_agreement_ms"]
        assert cost.notna().all() and cost.nunique() == 1, (worker, cost.tolist())


# -- the report on records of workers that did not agree ---------------------------------


def edit_records(log_dir: Path, worker: int, edit) -> None:
    """Rewrites one worker's records file, ``edit(record)`` on each record."""
    path = records_dir(log_dir) / f"worker-{worker}.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(edit(record) or record) + "\n" for record in records))


def copy_job(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def rename_run(run: str, drop_cluster: bool = False, shift_s: float = 0.0):
    def edit(record):
        record["run"] = run
        if drop_cluster:
            record.pop("cluster", None)
        for field in ("time", "analysis_end"):
            if record.get(field) is not None:
                record[field] += shift_s
        return record

    return edit


def cross_worker_numbers(report: kdt.Report) -> pd.DataFrame:
    columns = ["worker", "step", "sync_wait_ms", "transfer_ms", "worker_wait_ms", "last_worker"]
    return report.steps[columns].reset_index(drop=True)


@pytest.mark.slow
@pytest.mark.parametrize("drop_cluster", [False, True], ids=["fingerprint", "older-records"])
def test_runs_split_per_worker_are_named_and_merging_gives_the_agreed_numbers(
    two_workers, tmp_path, drop_cluster
):
    split = copy_job(two_workers, tmp_path / "split")
    edit_records(split, 1, rename_run("worker-1-alone", drop_cluster=drop_cluster))
    if drop_cluster:
        edit_records(split, 0, lambda record: record.pop("cluster", None) and None)
    agreed = kdt.Report.load(two_workers)
    run = agreed.runs["run"].iloc[0]

    apart = kdt.Report.load(split)
    merged = kdt.Report.load(split, merge_runs="detected")

    # As found: two runs, and one line that names them, their workers and the merge.
    assert apart.runs["run"].nunique() == 2
    line = f"Runs {run} (worker 0) and worker-1-alone (worker 1) look like one job's workers"
    assert line in apart.text()
    split_finding = [item for item in apart.advice() if item.code == "split-runs"]
    assert "merge_runs='detected'" in split_finding[0].fix
    assert apart.steps.loc[apart.steps["worker"] == 0, "sync_wait_ms"].max() < 5  # the bug
    # Merged: the agreed run's cross-worker numbers, to the last digit.
    assert merged.runs["run"].unique().tolist() == [run]
    pd.testing.assert_frame_equal(cross_worker_numbers(merged), cross_worker_numbers(agreed))
    assert f"Runs {run}, worker-1-alone were merged into run {run}" in merged.text()
    # The same merge named by hand, and from the command line.
    by_hand = kdt.Report.load(split, merge_runs=[[run, "worker-1-alone"]])
    pd.testing.assert_frame_equal(cross_worker_numbers(by_hand), cross_worker_numbers(agreed))
    printed = run_cli("report", str(split), "--merge-runs", f"{run},worker-1-alone")
    assert printed.returncode == 0, printed.stderr[-2000:]
    assert "Worker 1 is a straggler" in printed.stdout
    # what_if on the log dir merges what it detects by the cluster fingerprint, and says
    # so; older records it leaves apart (worker 0's run alone), saying how to merge.
    said = "could be two jobs at once" if drop_cluster else "merged into run"
    with pytest.warns(UserWarning, match=said):
        assert kdt.what_if(split)["run"].tolist() == [run]


@pytest.mark.slow
def test_two_jobs_one_after_the_other_stay_two_runs(two_workers, tmp_path):
    # A second real job's records: the first job's, under another id, 5 s after it
    # ended; in both layouts: each job one run, and each worker a run of its own (as
    # records without agreement would be). Same cluster addresses, so only time parts
    # them.
    log_dir = copy_job(two_workers, tmp_path / "logs" / "first")
    agreed = kdt.Report.load(log_dir)
    ended = agreed.steps["time"].max() + agreed.steps["step_ms"].max() / 1e3
    later = ended + 5.0 - agreed.runs["time"].min()
    second = copy_job(two_workers, tmp_path / "logs" / "second")
    for worker in (0, 1):
        edit_records(second, worker, rename_run("second-job", shift_s=later))

    report = kdt.Report.load(tmp_path / "logs")
    assert report.runs["run"].nunique() == 2
    assert report.job_findings() == [], report.text()

    for job_dir, name in ((log_dir, "first"), (second, "second")):
        edit_records(job_dir, 1, rename_run(f"{name}-w1", drop_cluster=True))
        edit_records(job_dir, 0, rename_run(f"{name}-w0", drop_cluster=True))
    spans = jobs.run_spans(records_by_type(
        (path, 0) for path in sorted((tmp_path / "logs").glob("*/keras_dp/worker-*.jsonl"))
    ))  # fmt: skip
    assert jobs.split_runs(spans) == [["first-w0", "first-w1"], ["second-w0", "second-w1"]]


@pytest.mark.slow
def test_a_worker_file_left_over_from_another_job_is_named_and_kept(two_workers, tmp_path):
    log_dir = copy_job(two_workers, tmp_path / "logs")
    run = kdt.Report.load(log_dir).runs["run"].iloc[0]
    # worker-1.jsonl of an earlier job on other ports, 3 hours before.
    edit_records(log_dir, 1, rename_run("earlier-job", shift_s=-3 * 3600))
    edit_records(
        log_dir,
        1,
        lambda record: record.update(cluster="0123456789ab") if "cluster" in record else None,
    )

    report = kdt.Report.load(log_dir)

    text = report.text()
    line = f"Run {run}: worker 1 of 2 recorded nothing here"
    assert line in text, text
    finding = [item for item in report.advice() if item.code == "missing-worker"]
    assert len(finding) == 1, text  # one line: the earlier job's run gets none of its own
    assert (
        "records here are run earlier-job, another job (cluster 0123456789ab" in finding[0].evidence
    )
    assert "started 3.0 h before" in finding[0].evidence
    assert "split-runs" not in [item.code for item in report.advice()]
    assert sorted(report.runs["run"]) == sorted([run, "earlier-job"])  # nothing lost
    assert len(report.steps) == len(kdt.Report.load(two_workers).steps)


@pytest.mark.slow
def test_one_run_id_reused_by_two_clusters_is_said(two_workers, tmp_path):
    log_dir = copy_job(two_workers, tmp_path / "logs")
    edit_records(
        log_dir,
        1,
        lambda record: record.update(cluster="0123456789ab") if "cluster" in record else None,
    )

    findings = [item for item in kdt.Report.load(log_dir).advice() if item.code == "mixed-jobs"]

    assert len(findings) == 1
    assert "worker 1 in cluster 0123456789ab" in findings[0].message


@pytest.mark.slow
def test_a_clock_5_s_ahead_is_aligned_detected_and_said(two_workers, tmp_path):
    split = copy_job(two_workers, tmp_path / "split")
    edit_records(split, 1, rename_run("worker-1-alone", shift_s=5.0))
    agreed = kdt.Report.load(two_workers)

    merged = kdt.Report.load(split, merge_runs="detected")

    assert merged.runs["run"].nunique() == 1  # the +5 s still overlaps
    ours, theirs = cross_worker_numbers(merged), cross_worker_numbers(agreed)
    # Aligned at the step ends: the same waits (to float rounding of the shifted times).
    pd.testing.assert_frame_equal(ours, theirs, check_exact=False, atol=1e-3)
    offset = merged.workers.set_index("worker").loc[1, "clock_offset_ms"]
    before = agreed.workers.set_index("worker").loc[1, "clock_offset_ms"]
    assert offset - before == pytest.approx(5000.0, abs=1.0)
    assert (
        "Run " in merged.text()
        and "worker 1's clock is 5.00 s ahead of worker 0's" in merged.text()
    )
    assert [item.code for item in agreed.job_findings()] == []  # one host: nothing to say


@pytest.mark.slow
def test_a_missing_worker_of_three_is_named(three_workers, tmp_path):
    log_dir = copy_job(three_workers, tmp_path / "logs")
    (records_dir(log_dir) / "worker-1.jsonl").unlink()
    run = kdt.Report.load(three_workers).runs["run"].iloc[0]

    report = kdt.Report.load(log_dir)

    assert f"Run {run}: worker 1 of 3 recorded nothing here." in report.text()
    finding = [item for item in report.advice() if item.code == "missing-worker"]
    assert "the log dir holds workers 0 and 2 of it" in finding[0].evidence
    assert sorted(report.runs["worker"]) == [0, 2]


# -- the same rules on made-up records (no training) -------------------------------------


def test_made_up_workers_of_one_job_are_found_and_a_parameter_server_run_is_not_short(
    tmp_path,
):
    from tests.helpers.recorded_runs import write_run

    multi = {"workers": 2, "strategy": "CollectiveAllReduceStrategy"}
    write_run(tmp_path / "job", "w0-run", 0, steps=12, start=1000.0, header_fields=multi)
    write_run(tmp_path / "job", "w1-run", 1, steps=12, start=1000.2, header_fields=multi)
    # Parameter servers: only the coordinator runs callbacks, whatever the cluster size.
    servers = {"workers": 3, "strategy": "ParameterServerStrategyV2"}
    write_run(tmp_path / "ps", "ps-run", 0, steps=12, start=5000.0, header_fields=servers)

    report = kdt.Report.load(tmp_path)

    assert [item.code for item in report.job_findings()] == ["split-runs"]
    assert "w0-run (worker 0) and w1-run (worker 1)" in report.job_findings()[0].message
    merged = kdt.Report.load(tmp_path, merge_runs="detected")
    assert sorted(merged.runs["run"].unique()) == ["ps-run", "w0-run"]
    assert merged.runs.set_index("worker").loc[1, "recorded_run"] == "w1-run"
    with pytest.raises(ValueError, match="records do not hold; the runs are"):
        kdt.Report.load(tmp_path, merge_runs=[["w0-run", "nope"]])


def write_split_job(log_dir: Path, runs: dict[str, int], start=1000.0, cluster="c0ffee", **fields):
    """One job of ``len(runs)`` workers whose workers did not agree: a run per worker
    (``{run: worker}``), each in a log dir of its own, overlapping in time."""
    multi = {
        "workers": len(runs),
        "strategy": "CollectiveAllReduceStrategy",
        "cluster": cluster,
        **fields,
    }
    for run, worker in runs.items():
        write_run(log_dir / run, run, worker, steps=12, start=start, header_fields=multi)
    return log_dir


def codes(report: kdt.Report) -> list[str]:
    return sorted(item.code for item in report.job_findings())


def test_a_merge_named_by_hand_keeps_the_lowest_workers_id_and_looks_again(tmp_path):
    two = write_split_job(tmp_path / "two", {"a": 0, "b": 1})
    three = write_split_job(tmp_path / "three", {"a": 0, "b": 1, "c": 2})

    # Named in any order: the merged run is worker 0's, as with "detected".
    merged = kdt.Report.load(two, merge_runs=[["b", "a"]])
    assert merged.runs["run"].tolist() == ["a", "a"]
    assert merged.runs.set_index("worker")["recorded_run"].tolist() == ["a", "b"]
    assert codes(merged) == ["merged-runs"], merged.text()
    assert "Runs a, b were merged into run a" in merged.text()
    # Part of a job: what is left is found again, on the merged runs.
    part = kdt.Report.load(three, merge_runs=[["b", "a"]])
    assert codes(part) == ["merged-runs", "split-runs"], part.text()
    assert "Runs a (workers 0 and 1) and c (worker 2) look like one job's workers" in part.text()
    # The command line, the same.
    printed = run_cli("report", str(two), "--merge-runs", "b,a")
    assert printed.returncode == 0, printed.stderr[-2000:]
    assert "Runs a, b were merged into run a" in printed.stdout


def test_a_merge_named_by_hand_that_cannot_be_one_job_is_refused(tmp_path):
    write_split_job(tmp_path / "job", {"a": 0, "b": 1})
    # Worker 0's next job, an hour later: a run that holds worker 0 again.
    write_split_job(tmp_path / "later", {"x": 0, "y": 1}, start=4600.0)

    with pytest.raises(ValueError, match="merge runs a and x, which both hold worker 0"):
        kdt.Report.load(tmp_path, merge_runs=[["a", "x"]])
    with pytest.raises(ValueError, match="names run b twice"):
        kdt.Report.load(tmp_path, merge_runs=[["a", "b"], ["b", "y"]])
    with pytest.raises(ValueError, match="names run b twice"):
        kdt.Report.load(tmp_path, merge_runs=[["a", "b", "b"]])
    with pytest.raises(ValueError, match=r"run\(s\) nope that the records do not hold"):
        kdt.Report.load(tmp_path, merge_runs=[["a", "nope"]])
    # Each job merged on its own is fine.
    both = kdt.Report.load(tmp_path, merge_runs=[["a", "b"], ["y", "x"]])
    assert sorted(both.runs["run"].unique()) == ["a", "x"]
    assert codes(both) == ["merged-runs", "merged-runs"], both.text()

    printed = run_cli("report", str(tmp_path), "--merge-runs", "a,x")
    assert printed.returncode == 2, printed.stderr[-2000:]
    lines = printed.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("keras-dp report: error: --merge-runs:")
    assert "both hold worker 0" in lines[0]


@pytest.mark.parametrize("cluster", ["c0ffee", None], ids=["fingerprint", "older-records"])
def test_what_if_on_a_log_dir_merges_only_runs_of_one_cluster(tmp_path, cluster):
    # Two workers' runs with a profiled breakdown each, 2 replicas per worker.
    profiled = {"breakdown": BALANCED, "replicas": 4}
    multi = {"workers": 2, "strategy": "CollectiveAllReduceStrategy", "cluster": cluster}
    for run, worker in (("a", 0), ("b", 1)):
        write_run(tmp_path / run, run, worker, start=1000.0, header_fields=multi, **profiled)

    with pytest.warns(UserWarning, match="what_if") as caught:
        table = kdt.what_if(tmp_path)

    said = " ".join(str(w.message) for w in caught)
    if cluster:  # one cluster: one job
        assert table["run"].tolist() == ["a"]
        assert "Runs a, b were merged into run a" in said
    else:  # the same size and time only: maybe two jobs, predicted apart, and said so
        assert sorted(table["run"]) == ["a", "b"]
        assert "Runs a (worker 0) and b (worker 1) look like one job's workers" in said
        assert "merge_runs='detected'" in said
