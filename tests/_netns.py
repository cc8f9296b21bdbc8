"""Nodes with their own network stacks: N Linux network namespaces joined by a bridge, for the multi-node tests.

Each node is a namespace ``<prefix>-n<i>`` with one interface, ``eth0``, at ``10.231.0.<i + 1>/24``; the other end
of each node's veth pair is a port of a bridge in a namespace of its own (the switch, ``<prefix>-sw``), so that
nothing is added to the machine's own network stack. A process started with :meth:`Node.popen` (``ip netns exec``)
sees that node's interfaces only: its loopback and ``eth0``. :meth:`Node.cut` sets the node's ``eth0`` down, as
when a node loses power or its switch port (no packet leaves or arrives, no connection is reset).

The namespaces are named after the pid of the process that made them (``hsnode<pid>-...``): at start, those of a
process that no longer runs (a test run killed before its clean-up) are removed, and nobody else's.
Making namespaces needs root and iproute2 (``ip``): :func:`unavailable` says in one line why they cannot be made.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import count
from typing import Any

PREFIX = "hsnode"
SUBNET = "10.231.0"  # node i at SUBNET.(i + 1), inside namespaces this module made
DEV = "eth0"
_clusters = count()


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done


def namespace_pids(netns: str) -> list[int]:
    """The processes that run in the namespace ``netns`` now."""
    done = _ip("netns", "pids", netns, check=False)
    return [int(p) for p in done.stdout.split()] if done.returncode == 0 else []


def _kill_and_remove(names: Sequence[str]) -> None:
    """SIGKILL whatever runs in each namespace, then delete the namespaces (their veth pairs go with them)."""
    for netns in names:
        for pid in namespace_pids(netns):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for netns in names:
        end = time.monotonic() + 10
        while namespace_pids(netns) and time.monotonic() < end:  # the killed must be gone before the delete
            time.sleep(0.05)
        _ip("netns", "delete", netns, check=False)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> list[str]:
    """Remove the namespaces (and what runs in them) left by a test process that no longer runs."""
    names = [line.split()[0] for line in _ip("netns", "list", check=False).stdout.splitlines() if line.strip()]
    stale = [n for n in names if (m := re.fullmatch(rf"{PREFIX}(\d+)-.*", n)) and not _alive(int(m.group(1)))]
    _kill_and_remove(stale)
    return stale


def unavailable() -> str | None:
    """Why network namespaces cannot be made here (one line), or None."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        return "network namespaces need iproute2's ip command"
    probe = f"{PREFIX}{os.getpid()}-probe"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot make a network namespace: ip netns add: {made.stderr.strip()}"
    _ip("netns", "delete", probe, check=False)
    return None


@dataclass(frozen=True)
class Node:
    index: int
    netns: str
    addr: str
    dev: str = DEV

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen:
        """``argv`` run in this node's namespace (``ip netns exec`` execs it: the pid is the command's)."""
        return subprocess.Popen(["ip", "netns", "exec", self.netns, *argv], **kwargs)

    def pids(self) -> list[int]:
        return namespace_pids(self.netns)

    def cut(self) -> None:
        """The node's link down: its packets go nowhere, and nobody is told."""
        _ip("-n", self.netns, "link", "set", self.dev, "down")

    def mend(self) -> None:
        _ip("-n", self.netns, "link", "set", self.dev, "up")

    def kill_all(self) -> list[int]:
        """SIGKILL every process of the node at once (a node that dies: its agent and workers together)."""
        pids = self.pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids


@contextmanager
def network_nodes(n: int) -> Iterator[list[Node]]:
    """``n`` nodes on one bridge; on the way out everything that runs in them is killed and they are removed."""
    prefix = f"{PREFIX}{os.getpid()}-{next(_clusters)}"
    switch, nodes = f"{prefix}-sw", [Node(i, f"{prefix}-n{i}", f"{SUBNET}.{i + 1}") for i in range(n)]
    made: list[str] = []
    try:
        _ip("netns", "add", switch)
        made.append(switch)
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        for node in nodes:
            _ip("netns", "add", node.netns)
            made.append(node.netns)
            port = f"v{node.index}"
            _ip("-n", switch, "link", "add", port, "type", "veth", "peer", "name", node.dev, "netns", node.netns)
            _ip("-n", switch, "link", "set", port, "master", "br0", "up")
            _ip("-n", node.netns, "addr", "add", f"{node.addr}/24", "dev", node.dev)
            _ip("-n", node.netns, "link", "set", node.dev, "up")
            _ip("-n", node.netns, "link", "set", "lo", "up")
        yield nodes
    finally:
        _kill_and_remove([*made[1:], *made[:1]])
