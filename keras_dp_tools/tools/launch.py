"""``keras-dp launch``: start the workers of a MultiWorkerMirroredStrategy job.

Each worker is the same command with its own ``TF_CONFIG`` (the cluster's addresses
and its index) and one ``KERAS_DP_RUN_ID`` for the job, so the records of all
workers land under one run. Output is streamed line by line with a ``[worker i]``
prefix. When a worker fails, the others are stopped (they would block in the next
all-reduce forever) and the launcher exits with the failed worker's status.

No TensorFlow here: the launcher only starts processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from keras_dp_tools.records.contract import LOG_DIR_ENV, RUN_ID_ENV
from keras_dp_tools.records.writer import LAUNCHER_RECORDS, RecordWriter, records_dir

DEFAULT_PORT = 2222  # for --host-list entries without a port (TensorFlow's usual one)
LOCAL_NAMES = {"localhost", "127.0.0.1", "::1"}


def free_ports(count: int) -> list[int]:
    """Loopback ports free now (held open together while picked, so they differ)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def cluster_addresses(workers: int | None, host_list: str | None) -> list[str]:
    """``host:port`` of every worker: ``workers`` on loopback with free ports, or the
    hosts given (``host`` or ``host:port``; the port defaults to 2222).

    Args:
        workers: how many local workers (used without ``host_list``).
        host_list: comma-separated hosts (``--host-list``), or None.

    Returns:
        The addresses, in worker order.

    Raises:
        ValueError: neither is given, ``host_list`` names no host, or ``workers``
            disagrees with it (the message says what to give).
    """
    if host_list:
        hosts = [host.strip() for host in host_list.split(",") if host.strip()]
        if not hosts:
            raise ValueError(f"--host-list names no host: received {host_list!r}")
        if workers is not None and workers != len(hosts):
            raise ValueError(
                f"--workers {workers} but --host-list names {len(hosts)} host(s): give one "
                "address per worker, or leave --workers out."
            )
        return [host if ":" in host else f"{host}:{DEFAULT_PORT}" for host in hosts]
    if not workers:
        raise ValueError("give --workers N (local workers) or --host-list HOST,HOST,...")
    return [f"localhost:{port}" for port in free_ports(workers)]


def is_local(address: str) -> bool:
    """Whether ``host:port`` names this machine (loopback, its host name or FQDN)."""
    host = address.rsplit(":", 1)[0].strip("[]")
    return host in LOCAL_NAMES or host in {socket.gethostname(), socket.getfqdn()}


def tf_config(addresses: Sequence[str], index: int) -> str:
    """The ``TF_CONFIG`` of worker ``index`` of a cluster of ``addresses``.

    Example:

    >>> import json
    >>> from keras_dp_tools.tools.launch import tf_config
    >>> config = json.loads(tf_config(["localhost:2222", "localhost:2223"], 1))
    >>> config["cluster"]["worker"][1], config["task"]
    ('localhost:2223', {'type': 'worker', 'index': 1})
    """
    return json.dumps(
        {"cluster": {"worker": list(addresses)}, "task": {"type": "worker", "index": index}}
    )


@dataclass
class WorkerExit:
    """How a worker process ended: its index and its ``Popen.returncode`` (negative:
    killed by that signal)."""

    index: int
    returncode: int

    def describe(self) -> str:
        if self.returncode < 0:
            try:
                name = signal.Signals(-self.returncode).name
            except ValueError:
                name = f"signal {-self.returncode}"
            return f"worker {self.index} was killed by {name}"
        return f"worker {self.index} exited with status {self.returncode}"

    @property
    def status(self) -> int:
        """The shell's convention: 128 + signal number for a killed process."""
        return 128 - self.returncode if self.returncode < 0 else self.returncode


def launch(
    command: Sequence[str],
    addresses: Sequence[str],
    *,
    run_id: str | None = None,
    log_dir: str | os.PathLike | None = None,
    grace_s: float = 10.0,
    print_line: Callable[[str], None] = lambda line: print(line, flush=True),
) -> int:
    """Runs ``command`` once per local worker of ``addresses`` (``keras-dp launch``).

    With ``log_dir``, workers get ``KERAS_DP_LOG_DIR`` and the launcher records how each
    one ended in ``<log_dir>/keras_dp/launcher.jsonl`` (``Report.workers.exit``).

    Args:
        command: the worker's command line (``["python", "train.py"]``).
        addresses: every worker's ``host:port``, in ``TF_CONFIG`` order.
        run_id: the job's run id (default: ``KERAS_DP_RUN_ID``, else a fresh one).
        log_dir: where the launcher's records go (None: none).
        grace_s: seconds the others get to stop after a worker fails.
        print_line: where the launcher's and the workers' lines go.

    Returns:
        The job's exit status: 0 when every worker succeeded, else the first failure's.

    Raises:
        ValueError: no command, or no worker on this machine (the message says what to do).

    Example:

    ```python
    from keras_dp_tools.tools.launch import cluster_addresses, launch

    launch(["python", "train.py"], cluster_addresses(2, None), log_dir="runs/job1")
    ```
    """
    if not command:
        raise ValueError("no command to launch: put it after '--', e.g. -- python train.py")
    local = [index for index, address in enumerate(addresses) if is_local(address)]
    if not local:
        raise ValueError(
            f"none of the workers {', '.join(addresses)} is on this machine "
            f"({socket.gethostname()}): run the launcher on each host of --host-list."
        )
    run_id = run_id or os.environ.get(RUN_ID_ENV) or _new_job_id()
    print_line(
        f"keras-dp launch: job {run_id}, {len(local)} of {len(addresses)} worker(s) here "
        f"({', '.join(addresses)})"
    )
    processes: dict[int, subprocess.Popen] = {}
    streams = []
    for index in local:
        env = {
            **os.environ,
            "TF_CONFIG": tf_config(addresses, index),
            RUN_ID_ENV: run_id,
            "PYTHONUNBUFFERED": "1",  # lines reach the prefixing stream as they are printed
            **({LOG_DIR_ENV: str(log_dir)} if log_dir is not None else {}),
        }
        process = subprocess.Popen(
            list(command),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopped with its children
        )
        processes[index] = process
        stream = threading.Thread(
            target=_prefix_lines, args=(process, f"[worker {index}] ", print_line), daemon=True
        )
        stream.start()
        streams.append(stream)
    try:
        failure = _wait_for_all_or_a_failure(processes)
    except KeyboardInterrupt:
        print_line("keras-dp launch: interrupted; stopping the workers")
        _stop(processes, grace_s, print_line)
        _record_exits(log_dir, run_id, processes, None)
        return 130
    if failure is not None:
        print_line(f"keras-dp launch: {failure.describe()}; stopping the other workers")
        _stop(processes, grace_s, print_line, settle_s=SETTLE_S)
    for stream in streams:
        stream.join(timeout=5)
    _record_exits(log_dir, run_id, processes, failure)
    if failure is not None:
        return failure.status
    print_line(f"keras-dp launch: all {len(processes)} worker(s) finished (job {run_id})")
    return 0


def _new_job_id() -> str:
    return f"job-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def _record_exits(log_dir, run_id, processes, failure: WorkerExit | None) -> None:
    if log_dir is None:
        return
    writer = RecordWriter(records_dir(log_dir) / LAUNCHER_RECORDS)
    try:
        for index, process in processes.items():
            ended = WorkerExit(index, process.returncode)
            if failure is not None and index != failure.index and process.returncode != 0:
                how = f"stopped by the launcher after {failure.describe()}"
            else:
                how = ended.describe().removeprefix(f"worker {index} ")
            writer.write(
                {"type": "worker_exit", "run": run_id, "worker": index, "time": time.time()}
                | {"exit_code": process.returncode, "reason": how}
            )
    finally:
        writer.close()


def _prefix_lines(process: subprocess.Popen, prefix: str, print_line) -> None:
    for raw in iter(process.stdout.readline, b""):
        print_line(prefix + raw.decode(errors="replace").rstrip("\n"))
    process.stdout.close()


def _wait_for_all_or_a_failure(processes: dict[int, subprocess.Popen]) -> WorkerExit | None:
    while True:
        running = False
        for index, process in processes.items():
            code = process.poll()
            if code is None:
                running = True
            elif code != 0:
                return WorkerExit(index, code)
        if not running:
            return None
        time.sleep(0.1)


# After a worker fails, the others may still be finishing the step they completed with
# it: its all-reduce is done, their step-end hooks (which write the step's record) run a
# few ms later. An interrupt in between lost that step from the records (seen once in
# six fresh-clone runs of the kill test); a worker blocked on the dead peer waits anyway.
SETTLE_S = 1.0


def _stop(
    processes: dict[int, subprocess.Popen], grace_s: float, print_line, settle_s: float = 0.0
) -> None:
    """SIGINT first (Python unwinds and records how the fit ended), SIGKILL after
    ``grace_s``: a worker blocked in an all-reduce with a dead peer may never return.
    ``settle_s``: time the workers get before the SIGINT, to record a finished step."""
    alive = {i: p for i, p in processes.items() if p.poll() is None}
    time.sleep(settle_s if alive else 0.0)
    alive = {i: p for i, p in alive.items() if p.poll() is None}
    for process in alive.values():
        _signal_group(process, signal.SIGINT)
    deadline = time.monotonic() + grace_s
    while alive and time.monotonic() < deadline:
        alive = {i: p for i, p in alive.items() if p.poll() is None}
        time.sleep(0.1)
    for index, process in alive.items():
        print_line(f"keras-dp launch: worker {index} did not stop in {grace_s:g} s; killing it")
        _signal_group(process, signal.SIGKILL)
        process.wait()


def _signal_group(process: subprocess.Popen, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
        os.killpg(process.pid, sig)
