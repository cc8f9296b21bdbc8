"""A Slurm cluster of several nodes for the multi-node launch tests: each node a network namespace of
tests/_netns.py with a slurmd of its own, slurmctld in another (tests/test_slurm_nodes.py). The one-node cluster it
builds on, its munged, slurm.conf and client commands: tests/slurm_cluster.py."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import psutil
from _netns import PREFIX as NETNS_PREFIX
from _netns import Node
from slurm_cluster import LocalSlurm, _binary


class NamespacedSlurm(LocalSlurm):
    """Several nodes, each a network namespace of its own (tests/_netns.py): slurmctld in ``controller``'s, one
    slurmd per node of ``compute`` in that node's, named ``<name_prefix><node index>`` and reached at the node's
    address; the client commands (sbatch, squeue, scontrol, ...) run in the controller's namespace.

    Each daemon also gets a UTS namespace whose host name is its node's name (slurmctld insists on running on the
    host SlurmctldHost names; a job's processes see their node's name, as on a real cluster). Names resolve inside
    the namespaces through a hosts file per namespace, ``/etc/netns/<ns>/hosts``, that lists every node: bind-mounted
    on /etc/hosts for the daemons and so for the jobs (:meth:`_on`), and by ``ip netns exec`` itself for the client
    commands and :meth:`Node.popen`. So MASTER_ADDR (the first node's name, common.sh) is that node's address, and
    gloo, which binds to the address of the host name, talks over the nodes' links: nothing of one node reaches
    another's loopback. The controller may also be a compute node (``compute`` includes it). munged runs in this
    process's namespace: its socket is a file, reachable from every namespace. All of it goes on :meth:`stop`: the
    daemons, whatever a job left on a node, the hosts files.
    """

    NETNS_ETC = Path("/etc/netns")

    def __init__(self, controller: Node, compute: Sequence[Node], root: Path | None = None,
                 partition: str = "debug", name_prefix: str = "hsn") -> None:
        super().__init__(root, partition)
        self.controller, self.compute = controller, list(compute)
        self.names = {n.netns: f"{name_prefix}{n.index}" for n in [controller, *self.compute]}
        self.node = self.names[controller.netns]  # SlurmctldHost's name
        self._etc_made: list[Path] = []

    @property
    def node_names(self) -> list[str]:
        return [self.names[n.netns] for n in self.compute]

    def name_of(self, node: Node) -> str:
        return self.names[node.netns]

    def client(self, *args: str) -> list[str]:
        return ["ip", "netns", "exec", self.controller.netns, *args]

    def _start_slurm(self) -> None:
        self._write_hosts()
        extra = ("# The nodes share this machine's cores: take the configured CPUs and memory as they are.\n"
                 "SlurmdParameters=config_overrides\n")
        self._write_conf(controller=f"{self.node}({self.controller.addr})", slurmd_files="slurmd-%n", extra=extra)
        for name in self.node_names:
            (self.root / f"spool-slurmd-{name}").mkdir(exist_ok=True)
        ctld = self._on(self.controller, _binary("slurmctld"), "-D", "-c", "-i", "-f", str(self.conf))
        self._spawn("slurmctld", ctld)
        for node in self.compute:
            name = self.name_of(node)
            self._spawn(f"slurmd-{name}", self._on(node, _binary("slurmd"), "-D", "-f", str(self.conf), "-N", name))

    def _on(self, node: Node, *argv: str) -> list[str]:
        """``argv`` in ``node``'s network namespace, with the node's hosts file on /etc/hosts and a host name of its
        own (a mount and a UTS namespace of its own; one exec chain: the pid is ``argv``'s). Not ``ip netns exec``:
        that mounts a sysfs of the namespace's own on /sys, without the cgroup file systems slurmd wants to find at
        start (even with proctrack/linuxproc); ``nsenter --net`` keeps the machine's /sys."""
        script = 'mount --bind "$1" /etc/hosts && hostname "$0" && shift && exec "$@"'
        return ["nsenter", f"--net=/run/netns/{node.netns}", "unshare", "--mount", "--uts", "--", "sh", "-c", script,
                self.name_of(node), str(self.NETNS_ETC / node.netns / "hosts"), *argv]

    def _node_lines(self) -> str:
        cpus = os.cpu_count() or 1
        mem_mb = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 * 0.9 / len(self.compute))
        lines = [f"NodeName={self.name_of(n)} NodeAddr={n.addr} CPUs={cpus} RealMemory={mem_mb} State=UNKNOWN"
                 for n in self.compute]
        lines.append(f"PartitionName={self.partition} Nodes={','.join(self.node_names)} Default=YES "
                     "MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def _write_hosts(self) -> None:
        names = "".join(f"{n.addr}\t{self.names[n.netns]}\n" for n in {n.netns: n for n in [self.controller,
                                                                                            *self.compute]}.values())
        if not self.NETNS_ETC.exists():
            self.NETNS_ETC.mkdir(mode=0o755)
            self._etc_made.append(self.NETNS_ETC)
        for stale in self.NETNS_ETC.glob(f"{NETNS_PREFIX}*"):  # of a test run killed before its clean-up
            if not Path("/run/netns", stale.name).exists():
                shutil.rmtree(stale, ignore_errors=True)
        for node in {n.netns: n for n in [self.controller, *self.compute]}.values():
            etc = self.NETNS_ETC / node.netns
            etc.mkdir(mode=0o755)  # the namespace's name is this run's own: nobody else's directory is there
            self._etc_made.append(etc)
            (etc / "hosts").write_text(f"127.0.0.1\tlocalhost\n{names}")

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            self._kill_stepds()
            for path in reversed(self._etc_made):
                if path == self.NETNS_ETC:
                    _rmdir_if_empty(path)  # another cluster may have its own directories there now
                else:
                    shutil.rmtree(path, ignore_errors=True)
            self._etc_made.clear()

    @staticmethod
    def stepds(node: Node) -> list[int]:
        """The slurmstepd processes on ``node`` (one per job step, and one for a batch script, while they last)."""
        return [pid for pid in node.pids() if _name(pid) == "slurmstepd"]

    def _kill_stepds(self) -> None:
        """SIGKILL what a job left in the nodes (a slurmstepd and its tasks on a node slurmctld could not reach)."""
        for node in self.compute:
            stepds = self.stepds(node)
            for pid in stepds:
                try:
                    stepd = psutil.Process(pid)
                    left = [stepd, *stepd.children(recursive=True)]
                except psutil.NoSuchProcess:
                    continue
                for proc in left:
                    try:
                        proc.kill()
                    except psutil.NoSuchProcess:
                        pass


def _name(pid: int) -> str:
    try:
        return psutil.Process(pid).name()
    except psutil.NoSuchProcess:
        return ""


def _rmdir_if_empty(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:
        pass
