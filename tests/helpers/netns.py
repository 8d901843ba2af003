"""Network namespaces joined by a rate-limited veth pair (root only): the link of the
what-if test and of the strategies benchmark. Traffic goes only to the addresses
inside the namespaces made here, or to loopback."""

from __future__ import annotations

import os
import shutil
import subprocess
from contextlib import contextmanager


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def namespaces_unavailable() -> str | None:
    """Why namespaces cannot be made here (None when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not installed (iproute2)"
    return None


def set_rate(namespaces, rate: str) -> None:
    """Limits what each ``(namespace, device)`` sends to ``rate`` (``tc`` notation,
    e.g. "200mbit"): a token bucket on the device's egress."""
    for namespace, device in namespaces:
        ip(
            "netns", "exec", namespace, "tc", "qdisc", "replace", "dev", device, "root",
            "tbf", "rate", rate, "burst", "32kb", "latency", "50ms",
        )  # fmt: skip


@contextmanager
def linked_namespaces(octet: int = 231):
    """Two network namespaces joined by a veth pair, addresses ``10.<octet>.<n>.1`` and
    ``.2`` only inside them, deleted afterwards; yields their (namespace, device,
    address) triples."""
    tag = f"kdt{octet}{os.getpid() % 100000}"
    subnet = f"10.{octet}.{os.getpid() % 250}"
    ends = [(f"{tag}a", f"{tag}va", f"{subnet}.1"), (f"{tag}b", f"{tag}vb", f"{subnet}.2")]
    try:
        for namespace, _, _ in ends:
            ip("netns", "add", namespace)
        ip("link", "add", ends[0][1], "type", "veth", "peer", "name", ends[1][1])
        for namespace, device, address in ends:
            ip("link", "set", device, "netns", namespace)
            ip("-n", namespace, "addr", "add", f"{address}/24", "dev", device)
            ip("-n", namespace, "link", "set", device, "up")
            ip("-n", namespace, "link", "set", "lo", "up")
        yield ends
    finally:
        for namespace, _, _ in ends:  # deleting a namespace deletes its veth end
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=30)
