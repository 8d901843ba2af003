"""One run id for all workers of a job, however they were started.

Every worker of a multi-worker job writes its own records file; the report treats the
files as one job only when their ``run`` ids agree. Where the id comes from, first
match wins (``run_id_source`` in the run header):

1. ``env``: ``KERAS_DP_RUN_ID`` (``keras-dp launch`` sets it for every worker; your own
   launcher may too). Also for single-worker runs.
2. ``slurm``: multi-worker jobs in a Slurm job step:
   ``slurm-<SLURM_JOB_ID>.<SLURM_STEP_ID>``. srun sets both for every task of a step,
   and TensorFlow's ``SlurmClusterResolver`` builds its cluster from one step's tasks;
   one sbatch job may run several steps. Processes the batch script starts itself
   (no srun: no step id) may be two jobs of one allocation: they agree (4.).
3. ``kubernetes``: multi-worker jobs in the pods of an Indexed Job:
   ``k8s-<job name>``. Kubernetes sets ``JOB_COMPLETION_INDEX`` in such pods and names
   each pod's host ``<job name>-<index>`` (Kubernetes docs, "Job with Pod-to-Pod
   Communication"). Only where every address of the cluster is such a pod's
   (``<job name>-<index>[.subdomain]:port``): one cluster over the child Jobs of a
   JobSet (``<jobset>-<job>-<i>``) would get an id per child Job, so it agrees (4.).
   A Job deleted and created again under the same name gets the same id: its workers
   then show as a restart of the earlier run.
4. ``agreed``: any other multi-worker job (workers started by hand, a shell loop, MPI):
   the workers agree on an id when ``fit`` begins, through the key-value store of
   TensorFlow's coordination service, which ``MultiWorkerMirroredStrategy`` starts for
   every multi-worker cluster (TensorFlow's own preemption handling keeps its keys
   there). Each worker offers an id; the first offer stored wins and every worker reads
   it back. No collective op runs, so a worker that never asks (e.g. one without our
   callbacks) cannot shift the instance keys of the training's all-reduces or leave the
   others blocked: they ask the store, not each other. It runs once per process, in a
   thread bounded by ``AGREEMENT_TIMEOUT_S``; the header's ``run_id_agreement_ms``
   says what it took.
5. ``local``: single-worker runs, and a multi-worker run whose agreement failed (one
   ``MeasurementWarning``): a fresh id per run. The header's ``cluster`` fingerprint
   still lets ``kdt.Report`` find such workers of one job and merge them.

A process that starts another run later (a second ``fit`` with another strategy or
batch) numbers it from the shared id: ``<id>.2``, ``<id>.3``, ...: every worker runs
the same fits in the same order, so the numbers agree without asking again.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from keras_dp_tools.capture.base import MeasurementWarning, parameter_server_strategy
from keras_dp_tools.common.warn import warn
from keras_dp_tools.records.contract import RUN_ID_ENV

# The sources of a run id, in the order they are tried (``run_id_source``).
RUN_ID_SOURCES = ("env", "slurm", "kubernetes", "agreed", "local")
# Shared ids: every worker of the job gets the same one without asking the others.
GIVEN_SOURCES = ("env", "slurm", "kubernetes")
# The longest a worker waits for the coordination service's store (once per process).
AGREEMENT_TIMEOUT_S = 30.0
_KEY_PREFIX = "keras_dp_tools/run_id/"
_HOSTNAME_LIMIT = 63  # a DNS label: a longer pod name is cut, and the rule does not hold


@dataclass(frozen=True)
class JobId:
    """Where the runs of this process get their ids from.

    Attributes:
        job_id: the id every worker shares, or None for ``local`` (a fresh id per run).
        source: one of ``RUN_ID_SOURCES``.
        cluster: the cluster's fingerprint (``cluster_fingerprint``), None for one worker.
        agreement_ms: how long the agreement took on this worker (``agreed`` only).

    Example:

    >>> from keras_dp_tools.capture.job_identity import JobId
    >>> JobId("slurm-4242.0", "slurm").header_fields()["run_id_source"]
    'slurm'
    """

    job_id: str | None
    source: str
    cluster: str | None = None
    agreement_ms: float | None = None

    def header_fields(self) -> dict:
        """The run header's fields that say how its id was chosen."""
        return {
            "run_id_source": self.source,
            "cluster": self.cluster,
            "run_id_agreement_ms": self.agreement_ms,
        }


def local_run_id() -> str:
    """A fresh id for a run of its own.

    Returns:
        ``<YYYYmmdd-HHMMSS>-<6 hex digits>``.
    """
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def given_job_id(
    environ: Mapping[str, str],
    hostname: str,
    workers: int,
    cluster: Mapping[str, list[str]] | None = None,
) -> tuple[str, str] | None:
    """``(id, source)`` from the environment alone, or None: ``KERAS_DP_RUN_ID``, then
    for a job of more than one worker the Slurm step or the Kubernetes Indexed Job it
    runs in (see the module docstring). Pure: the same inputs on every worker give the
    same answer.

    Args:
        environ: the process's environment.
        hostname: this host's name (a pod's is ``<job name>-<index>``).
        workers: the job's worker count.
        cluster: the cluster spec (``strategy_cluster``): the Kubernetes id holds only
            where every address is a pod of this Job (``<job name>-<index>``), not of a
            sibling Job (a JobSet's).

    Returns:
        ``(id, source)``, or None where the environment does not name the job.

    Example:

    >>> from keras_dp_tools.capture.job_identity import given_job_id
    >>> given_job_id({"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0"}, "node7", workers=2)
    ('slurm-4242.0', 'slurm')
    """
    given = (environ.get(RUN_ID_ENV) or "").strip()
    if given:
        return given, "env"
    if workers < 2:  # one process needs no agreement (a sweep's runs keep their own ids)
        return None
    job = (environ.get("SLURM_JOB_ID") or "").strip()
    step = (environ.get("SLURM_STEP_ID") or "").strip()
    # Only srun's tasks share a step; processes the batch script starts itself have no
    # step id, and two jobs in one allocation would share ``slurm-<job>``.
    if job and step.isdigit():
        return f"slurm-{job}.{step}", "slurm"
    index = (environ.get("JOB_COMPLETION_INDEX") or "").strip()
    suffix = f"-{index}"
    if (
        index.isdigit()
        and len(hostname) < _HOSTNAME_LIMIT
        and hostname.endswith(suffix)
        and len(hostname) > len(suffix)
    ):
        name = hostname[: -len(suffix)]
        if _pods_of(name, cluster):
            return f"k8s-{name}", "kubernetes"
    return None


def _pods_of(job_name: str, cluster: Mapping[str, list[str]] | None) -> bool:
    """Whether every address of ``cluster`` is a pod of the Job ``job_name``: its host's
    first label is ``<job name>-<index>`` (``trainer-0.trainer:2222``)."""
    addresses = [address for tasks in (cluster or {}).values() for address in tasks]
    hosts = [address.rsplit(":", 1)[0].split(".", 1)[0] for address in addresses]
    prefix = f"{job_name}-"
    return bool(hosts) and all(
        host.startswith(prefix) and host[len(prefix) :].isdigit() for host in hosts
    )


def environment_job_id(environ: Mapping[str, str] = os.environ) -> JobId:
    """Where a single process's runs get their ids.

    Args:
        environ: the process's environment.

    Returns:
        ``KERAS_DP_RUN_ID``'s id (source ``env``) if set, else ``local`` (a fresh id
        per run).

    Example:

    >>> from keras_dp_tools.capture.job_identity import environment_job_id
    >>> environment_job_id({"KERAS_DP_RUN_ID": "exp7"})
    JobId(job_id='exp7', source='env', cluster=None, agreement_ms=None)
    """
    given = given_job_id(environ, hostname="", workers=1)
    return JobId(*given) if given else JobId(None, "local")


def cluster_fingerprint(cluster: Mapping[str, list[str]] | None) -> str | None:
    """A short hash of the cluster's sorted ``job:address`` entries: the same on every
    worker of one job.

    Args:
        cluster: ``{job: [address, ...]}`` (``strategy_cluster``), or None.

    Returns:
        12 hex digits; None for a single worker (no cluster, or one task).

    Example:

    >>> from keras_dp_tools.capture.job_identity import cluster_fingerprint
    >>> a = cluster_fingerprint({"worker": ["h0:2222", "h1:2222"]})
    >>> a == cluster_fingerprint({"worker": ["h1:2222", "h0:2222"]}), len(a)
    (True, 12)
    """
    if not cluster:
        return None
    addresses = sorted(f"{job}:{address}" for job, tasks in cluster.items() for address in tasks)
    if len(addresses) < 2:
        return None
    return hashlib.sha256("\n".join(addresses).encode()).hexdigest()[:12]


def strategy_cluster(strategy) -> dict[str, list[str]] | None:
    """The cluster spec of a multi-worker strategy.

    Args:
        strategy: a ``tf.distribute`` strategy.

    Returns:
        ``{job: [address, ...]}``; None for a single-process strategy or a resolver
        that cannot say.
    """
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not getattr(resolver, "task_type", None):
        return None
    try:
        jobs = resolver.cluster_spec().as_dict()
        # A job of sparse tasks is a dict {task index: address}.
        return {
            job: [str(task) for task in (tasks.values() if isinstance(tasks, dict) else tasks)]
            for job, tasks in jobs.items()
        }
    except Exception:  # a resolver that cannot say: treated as one worker
        return None


class _Agreement:
    """The outcome of this process's agreement, per cluster: asked once."""

    lock = threading.Lock()
    outcomes: ClassVar[dict[str, JobId]] = {}
    warned = False


def job_id_for(strategy, workers: int, environ: Mapping[str, str] = os.environ) -> JobId:
    """Where this process's runs under ``strategy`` get their ids (see the module
    docstring). The environment is read every time (cheap); the agreement runs once
    per process and cluster, and never raises: a failure warns once and gives
    ``local``.

    Args:
        strategy: the strategy being fit under.
        workers: the job's worker count.
        environ: the process's environment.

    Returns:
        The ``JobId``.
    """
    import socket

    spec = strategy_cluster(strategy) if workers > 1 else None
    cluster = cluster_fingerprint(spec)
    given = given_job_id(environ, socket.gethostname(), workers, spec)
    if given is not None:
        return JobId(given[0], given[1], cluster)
    if workers < 2 or cluster is None or parameter_server_strategy(strategy):
        # Under parameter servers only the coordinator runs callbacks: nobody to agree with.
        return JobId(None, "local", cluster)
    with _Agreement.lock:
        known = _Agreement.outcomes.get(cluster)
        if known is None:
            known = _Agreement.outcomes[cluster] = _agree(cluster)
    return known


def _agree(cluster: str) -> JobId:
    started = time.perf_counter()
    outcome: dict = {}

    def ask() -> None:
        try:
            outcome["id"] = agree_through_coordination_service(_KEY_PREFIX + cluster)
        except Exception as error:  # the service is off, or unreachable
            outcome["error"] = error

    # A thread bounds the wait: the store's calls have no deadline of their own.
    asking = threading.Thread(target=ask, name="keras_dp_run_id", daemon=True)
    asking.start()
    asking.join(AGREEMENT_TIMEOUT_S)
    elapsed_ms = (time.perf_counter() - started) * 1e3
    if "id" in outcome:
        return JobId(outcome["id"], "agreed", cluster, round(elapsed_ms, 3))
    why = outcome.get("error") or TimeoutError(f"no answer in {AGREEMENT_TIMEOUT_S:g} s")
    if not _Agreement.warned:
        _Agreement.warned = True
        warn(
            "keras_dp_tools could not agree on one run id with the other workers "
            f"({type(why).__name__}: {why}); each worker records under its own id. "
            "Training continues. kdt.Report.load(log_dir, merge_runs='detected') joins "
            f"the workers' runs again; or set {RUN_ID_ENV} to one value on every worker.",
            MeasurementWarning,
        )
    return JobId(None, "local", cluster)


def agree_through_coordination_service(key: str) -> str:
    """Offers a fresh id under ``key`` in the coordination service's key-value store
    and returns the id stored there: the first worker's offer wins (an insert of a key
    that exists fails), every worker reads the same value back.

    Args:
        key: the store's key for this job's cluster.

    Returns:
        The id stored under ``key``.

    Raises:
        Exception: whatever TensorFlow raises when the service is off or unreachable.
    """
    from tensorflow.python.eager import context

    service = context.context()
    offer = local_run_id()
    # Fails where another worker's offer is stored already (AlreadyExists).
    with contextlib.suppress(Exception):
        service.set_config_key_value(key, offer)
    return service.get_config_key_value(key, int(AGREEMENT_TIMEOUT_S * 1e3))


def next_run_id(job: JobId, started: int, previous: str | None = None) -> str:
    """The id of a recorder's next run of ``job``, after it ``started`` runs: the shared
    id first, then ``<id>.2``, ``<id>.3``, ... (the same on every worker, as they run the
    same fits in the same order); a fresh id per run for ``local``. Never ``previous``.

    Args:
        job: where the process's runs get their ids.
        started: runs the recorder started before this one.
        previous: the id of its last run, if any.

    Returns:
        The new run's id.

    Example:

    >>> from keras_dp_tools.capture.job_identity import JobId, next_run_id
    >>> job = JobId("exp7", "env")
    >>> next_run_id(job, 0), next_run_id(job, 1, previous="exp7")
    ('exp7', 'exp7.2')
    """
    if job.job_id is None:
        run_id = local_run_id()
        return run_id if run_id != previous else f"{run_id}.{uuid.uuid4().hex[:4]}"
    run_id = job.job_id if started == 0 else f"{job.job_id}.{started + 1}"
    return run_id if run_id != previous else f"{job.job_id}.{started + 2}"
