"""One worker or parameter server of the ``parameter_server`` candidate's cluster:
``python -m keras_dp_tools.tools.strategies._ps_server CLUSTER_JSON JOB INDEX PARENT_PID``.

Started by ``_ps_trial`` (not meant to be run by hand). It serves until killed, and
leaves as soon as its parent (the trial) is gone: ``PR_SET_PDEATHSIG`` covers a killed
parent, this watch on the parent's pid covers the rest (a prefix such as
``ip netns exec`` that does not keep the signal).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time


def _leave_with(parent_pid: int) -> None:
    while True:
        if os.getppid() != parent_pid:
            os._exit(0)  # the trial is gone: nothing else would stop this server
        time.sleep(0.5)


def main() -> None:
    """Serves one task (``argv``: cluster JSON, job, index, the parent's pid) until the
    parent exits."""
    cluster, job = json.loads(sys.argv[1]), sys.argv[2]
    index, parent_pid = int(sys.argv[3]), int(sys.argv[4])
    threading.Thread(target=_leave_with, args=(parent_pid,), daemon=True).start()
    import tensorflow as tf

    server = tf.distribute.Server(
        tf.train.ClusterSpec(cluster), job_name=job, task_index=index, protocol="grpc", start=True
    )
    print(f"{job} {index} serving at {cluster[job][index]}", flush=True)
    server.join()


if __name__ == "__main__":
    main()
