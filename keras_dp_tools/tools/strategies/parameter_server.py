"""The ``parameter_server`` candidate of ``compare_strategies``: ParameterServerStrategy
on a local cluster that its trial process starts and stops.

The trial (``_ps_trial``, a ``tools.tuning.child`` process) is the cluster's coordinator
(the ``chief`` task). It starts every worker and parameter server as a process of its
own (``_ps_server``: a ``tf.distribute.Server`` that joins), trains with tf_keras's
``Model.fit`` through a ``ClusterCoordinator`` and a
``tf.keras.utils.experimental.DatasetCreator`` (what ``fit`` needs under this strategy;
Keras 3's ``fit`` does not run under it), and kills the servers when it ends. The
servers die with it even when it is killed (``PR_SET_PDEATHSIG``, and a watch on their
parent's pid).

Steps: the strategy is asynchronous, and each ``fit`` step is one batch of
``per_replica_batch`` examples on whichever worker is free. A step of this candidate
is one batch on every worker (``workers`` fit steps), so that its global batch is
``per_replica_batch x workers``, as for the synchronous candidates.

Options (``compare_strategies(options={"parameter_server": {...}})``):

- ``workers`` (int, default 2), ``ps`` (int, default 1): how many of each.
- ``hosts`` (dict role -> address, default ``"localhost"`` for ``chief``, ``worker``
  and ``ps``): the address each role's servers listen on and the others dial. The
  servers listen on every address of their network namespace; this is the one the
  cluster spec names.
- ``command_prefix`` (dict role -> list of str, default none): put before the server
  command of that role (``worker`` or ``ps``), e.g. ``["ip", "netns", "exec", "NS"]``
  to run the parameter servers in the network namespace NS. ``ip netns exec`` execs
  the server in place, so it stays the trial's child and dies with it.

Example, the parameter servers behind a link: ``benchmarks/strategies_netns.py`` makes
two network namespaces joined by a rate-limited veth pair, ``kdtA`` (10.232.0.1) for the
parameter server and ``kdtB`` (10.232.0.2) for everything else, and runs
``compare_strategies`` inside ``kdtB`` with

    options = {"parameter_server": {
        "workers": 2, "ps": 1,
        "hosts": {"chief": "10.232.0.2", "worker": "10.232.0.2", "ps": "10.232.0.1"},
        "command_prefix": {"ps": ["ip", "netns", "exec", "kdtA"]},
    }}

Every variable read and gradient push then crosses the link; the coordinator's calls to
the workers stay inside ``kdtB``.
"""

from __future__ import annotations

import numbers

from keras_dp_tools.tools.tuning.child import tf_keras_missing

CHILD_MODULE = "keras_dp_tools.tools.strategies._ps_trial"
SERVER_MODULE = "keras_dp_tools.tools.strategies._ps_server"
DEFAULT_OPTIONS: dict = {"workers": 2, "ps": 1}
ROLES = ("chief", "worker", "ps")
SERVER_ROLES = ("worker", "ps")
_KNOWN = {"workers", "ps", "hosts", "command_prefix"}


def resolve_options(options: dict | None) -> dict:
    """``options`` over ``DEFAULT_OPTIONS``, checked: ``workers``, ``ps``, ``hosts``
    (every role filled in) and ``command_prefix`` (every server role filled in); a
    ValueError saying what was received otherwise."""
    options = dict(options or {})
    unknown = sorted(set(options) - _KNOWN)
    if unknown:
        raise ValueError(
            f"Unknown parameter_server option(s) {unknown}: the options are "
            f"{sorted(_KNOWN)} (see keras_dp_tools.tools.strategies.parameter_server)."
        )
    resolved = {**DEFAULT_OPTIONS, **options}
    for name in ("workers", "ps"):
        value = resolved[name]
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
            raise ValueError(
                f"parameter_server option {name!r} must be a positive integer, received {value!r}."
            )
        resolved[name] = int(value)
    hosts = resolved.get("hosts") or {}
    if not isinstance(hosts, dict) or set(hosts) - set(ROLES):
        raise ValueError(
            f"parameter_server option 'hosts' maps roles {list(ROLES)} to addresses, "
            f"received {hosts!r}."
        )
    resolved["hosts"] = {role: str(hosts.get(role, "localhost")) for role in ROLES}
    prefixes = resolved.get("command_prefix") or {}
    if not isinstance(prefixes, dict) or set(prefixes) - set(SERVER_ROLES):
        raise ValueError(
            "parameter_server option 'command_prefix' maps 'worker' and/or 'ps' to a list "
            f"of strings put before that server's command, received {prefixes!r}."
        )
    for role, prefix in prefixes.items():
        if not isinstance(prefix, (list, tuple)) or not all(isinstance(p, str) for p in prefix):
            raise ValueError(
                f"parameter_server command_prefix[{role!r}] must be a list of strings, "
                f"received {prefix!r}."
            )
    resolved["command_prefix"] = {role: list(prefixes.get(role, [])) for role in SERVER_ROLES}
    return resolved


def skip_reason(options: dict) -> str | None:
    """Why the candidate cannot run here (None when it can): it needs tf_keras."""
    resolve_options(options)  # bad options are an error, not a reason to skip
    return tf_keras_missing("ParameterServerStrategy")


def replicas(options: dict) -> int:
    """Workers that each take a batch of ``per_replica_batch`` per step (one CPU or
    device each: the local workers have one device)."""
    return resolve_options(options)["workers"]


def code(options: dict) -> str:
    """The lines that build the strategy on the coordinator, as a user would write them
    (the trial runs them, with ``TF_CONFIG`` naming its local cluster)."""
    resolved = resolve_options(options)
    workers, ps = resolved["workers"], resolved["ps"]
    return "\n".join(
        [
            f"# On the coordinator; TF_CONFIG names a 'chief', {workers} 'worker' and {ps} 'ps'",
            "# task(s), each worker and parameter server runs tf.distribute.Server(...).join().",
            "# Train with model.fit(tf.keras.utils.experimental.DatasetCreator(dataset_fn),",
            "#     steps_per_epoch=...).",
            "import os",
            'os.environ["TF_USE_LEGACY_KERAS"] = "1"  # before TensorFlow is imported',
            "import tensorflow as tf",
            "strategy = tf.distribute.ParameterServerStrategy(",
            "    tf.distribute.cluster_resolver.TFConfigClusterResolver()",
            ")",
        ]
    )
