"""ParameterServerStrategy over a rate-limited link against MirroredStrategy on one
machine: the story of issue 28, measured (root only: network namespaces).

The parameter server runs in namespace A, the coordinator and the workers in namespace
B, joined by a veth pair whose both ends ``tc`` limits to ``--rate``; every variable
read and gradient push crosses it. MirroredStrategy trains the same model over as many
logical CPUs as there are workers, in B, with no link. Each round times both, in turns.

The measurement is ``kdt.compare_strategies(strategies=["mirrored", "parameter_server"],
options=...)``, the parameter server's addresses and namespace in its options.

    python benchmarks/strategies_netns.py [--rate 200mbit] [--width 1024] [--json]

``bench.py --only strategies-netns`` runs it and writes its section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FEATURES = int(os.environ.get("KDT_NETNS_WIDTH", "1024"))


def build_model():
    """Two hidden layers of FEATURES (2.1 M parameters at 1024): 8.4 MB of float32."""
    import tensorflow as tf

    keras = tf.keras  # Keras 3 for MirroredStrategy, tf_keras in the PS trial
    model = keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(FEATURES, activation="relu"),
            keras.layers.Dense(FEATURES, activation="relu"),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer=keras.optimizers.SGD(1e-3), loss="mse")
    return model


def make_dataset(global_batch):
    import numpy as np
    import tensorflow as tf

    x = np.random.default_rng(0).normal(size=(global_batch, FEATURES)).astype("float32")
    return tf.data.Dataset.from_tensors((x, x[:, :1]))


def parameters() -> int:
    return FEATURES * FEATURES + FEATURES + FEATURES * FEATURES + FEATURES + FEATURES + 1


# -- the link ---------------------------------------------------------------------------

_SINK = r"""
import socket, sys
server = socket.socket(); server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind((sys.argv[1], int(sys.argv[2]))); server.listen(1)
print("listening", flush=True)
connection, _ = server.accept()
while connection.recv(1 << 20):
    pass
"""


def link_mbytes_per_s(namespaces, megabytes: int = 12) -> float:
    """TCP throughput from namespace B to A (a sink in A), MB/s: what the link carries."""
    (a, _, address_a), (b, _, _) = namespaces
    port = "23999"
    sink = subprocess.Popen(
        ["ip", "netns", "exec", a, sys.executable, "-c", _SINK, address_a, port],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        sink.stdout.readline()
        send = (
            "import socket, sys, time\n"
            f"s = socket.create_connection(({address_a!r}, {port}))\n"
            f"block = bytes(1 << 20); start = time.perf_counter()\n"
            f"for _ in range({megabytes}): s.sendall(block)\n"
            "s.shutdown(socket.SHUT_WR); s.recv(1)\n"
            "print(time.perf_counter() - start)\n"
        )
        seconds = subprocess.run(
            ["ip", "netns", "exec", b, sys.executable, "-c", send],
            capture_output=True, text=True, check=True, timeout=120,
        ).stdout  # fmt: skip
        return megabytes * (1 << 20) / 1e6 / float(seconds)
    finally:
        sink.kill()
        sink.wait()


def outside(args) -> dict:
    """Makes the namespaces and the link, then measures inside namespace B."""
    from tests.helpers.netns import linked_namespaces, namespaces_unavailable, set_rate

    reason = namespaces_unavailable()
    if reason:
        raise SystemExit(f"strategies-netns: {reason}")
    with linked_namespaces(octet=232) as ends:
        set_rate([(namespace, device) for namespace, device, _ in ends], args.rate)
        link = link_mbytes_per_s(ends)
        (ps_namespace, _, ps_address), (namespace, _, address) = ends
        config = {
            **vars(args),
            "ps_namespace": ps_namespace,
            "ps_address": ps_address,
            "address": address,
        }
        command = ["ip", "netns", "exec", namespace, sys.executable, __file__]
        command += ["--inside", json.dumps(config)]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "KDT_NETNS_WIDTH": str(args.width)}
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
        if done.returncode:
            raise SystemExit(f"the measurement failed:\n{done.stderr[-4000:]}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
    result.update(link_mbytes_per_s=link, rate=args.rate)
    return result


# -- inside namespace B -----------------------------------------------------------------


def ps_options(config: dict) -> dict:
    return {
        "workers": config["workers"],
        "ps": 1,
        "hosts": {
            "chief": config["address"],
            "worker": config["address"],
            "ps": config["ps_address"],
        },
        "command_prefix": {"ps": ["ip", "netns", "exec", config["ps_namespace"]]},
    }


def inside(config: dict, log_dir: Path) -> dict:
    import keras_dp_tools as kdt

    base = {
        "parameters": parameters(),
        "variable_bytes": parameters() * 4,
        "per_replica_batch": config["per_replica_batch"],
        "workers": config["workers"],
        "steps": config["steps"],
        "rounds": config["rounds"],
    }
    comparison = kdt.compare_strategies(
        f"{__file__}:build_model",
        f"{__file__}:make_dataset",
        strategies=["mirrored", "parameter_server"],
        per_replica_batch=config["per_replica_batch"],
        steps=config["steps"] * config["rounds"],
        rounds=config["rounds"],
        options={
            "mirrored": {"replicas": config["workers"]},
            "parameter_server": ps_options(config),
        },
        log_dir=log_dir,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
        timeout=1800,
    )
    table = comparison.table.set_index("candidate")
    rates = {name: list(table.loc[name, "round_examples_per_s"]) for name in table.index}
    return {
        **base,
        "examples_per_s": rates,
        "evidence": table.loc["parameter_server", "evidence"],
        "verdict": comparison.verdict,
        "table": comparison.table.drop(columns=["evidence"]).to_dict("records"),
    }


# -- results ----------------------------------------------------------------------------


def summary(result: dict) -> dict:
    """The factor (MirroredStrategy's examples/s over the parameter server's, median of
    the per-round ratios, min and max) and the link's share of a PS step."""
    rates = result["examples_per_s"]
    ps, mirrored = rates["parameter_server"], rates["mirrored"]
    ratios = [m / p for m, p in zip(mirrored, ps, strict=True)]
    evidence = result["evidence"]
    link_bytes_per_s = result["link_mbytes_per_s"] * 1e6
    return {
        "factor": statistics.median(ratios),
        "factor_min": min(ratios),
        "factor_max": max(ratios),
        "ps_examples_per_s": statistics.median(ps),
        "mirrored_examples_per_s": statistics.median(mirrored),
        # All workers' reads and pushes cross the parameter server's one link: reads one
        # way, pushes the other. Taking turns, a step needs both times; overlapping
        # fully (the link is full duplex), the longer one.
        "link_ms_per_step": 1000 * evidence["bytes_per_step"] / link_bytes_per_s,
        "link_ms_per_step_duplex": 1000
        * max(evidence["read_bytes"], evidence["push_bytes"])
        / link_bytes_per_s,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", default="200mbit", help="tc rate of each end of the link")
    parser.add_argument("--width", type=int, default=1024, help="hidden layers' width")
    parser.add_argument("--per-replica-batch", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--inside", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.inside:
        config = json.loads(args.inside)
        with tempfile.TemporaryDirectory(prefix="kdt-netns-") as scratch:
            print(json.dumps(inside(config, Path(scratch)), default=str))
        return 0
    result = outside(args)
    result["summary"] = summary(result)
    print(json.dumps(result, default=str, indent=None if args.json else 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
