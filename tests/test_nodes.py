"""Several nodes, each with its own network stack (tests/_netns.py: network namespaces on one bridge).

Each node runs its own torchrun agent, as a user starts one per machine: ``torchrun --nnodes=N
--nproc_per_node=2 --rdzv-backend=c10d --rdzv-endpoint=<node 0>:<port>``, inside the node's namespace, with gloo
on the node's own interface (``GLOO_SOCKET_IFNAME``, ``--local-addr``); the namespaces share the machine's
hostname, so node 0 is told it hosts the rendezvous (``--rdzv-conf=is_host=1``). No process of one node can
reach another's loopback: every byte between nodes goes over the veth pairs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from _netns import DEV, Node
from _warm_python import run_processes
from test_fp64_invariance import TOLERANCE, method_argv, update_gap

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="network namespaces are Linux's"),
]

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
RDZV_PORT = 29400  # inside the nodes' own namespaces: nothing else listens there
RUNS_WORKER = str(REPO / "tests" / "_runs_worker.py")  # trains a list of runs, writing each one's initial.pt


class Job:
    """One torchrun agent per node, each in its node's namespace, its output in ``<log_dir>/node<i>.log``."""

    def __init__(self, nodes: Sequence[Node], nproc: int, argv: Sequence[str], log_dir: Path, *, rdzv_id: str,
                 torchrun: Sequence[str] = ()) -> None:
        self.nodes, self.logs = list(nodes), [log_dir / f"node{n.index}.log" for n in nodes]
        log_dir.mkdir(parents=True, exist_ok=True)
        self.procs = []
        for node, log in zip(self.nodes, self.logs):
            cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={len(nodes)}",
                   f"--nproc_per_node={nproc}", "--rdzv-backend=c10d", f"--rdzv-endpoint={nodes[0].addr}:{RDZV_PORT}",
                   f"--rdzv-id={rdzv_id}", f"--rdzv-conf=is_host={int(node.index == 0)}", f"--local-addr={node.addr}",
                   *torchrun, *argv]
            with log.open("w") as out:
                self.procs.append(node.popen(cmd, env={**ENV, "GLOO_SOCKET_IFNAME": DEV}, stdout=out,
                                             stderr=subprocess.STDOUT, cwd=REPO))

    def log(self, i: int) -> str:
        return self.logs[i].read_text(errors="replace")

    def tails(self) -> str:
        return "\n".join(f"--- node {i}:\n{self.log(i)[-3000:]}" for i in range(len(self.nodes)))

    def wait(self, timeout: float) -> list[int]:
        """Every agent's exit code; what still runs after ``timeout`` is killed and the test fails."""
        end = time.monotonic() + timeout
        for proc in self.procs:
            try:
                proc.wait(timeout=max(end - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                for node in self.nodes:
                    node.kill_all()
                raise AssertionError(f"the job did not end within {timeout} s:\n{self.tails()}") from None
        return [proc.returncode for proc in self.procs]


@pytest.fixture(scope="module")
def two_nodes(network_nodes) -> list[Node]:
    return network_nodes(2)


def test_two_nodes_of_two_processes_equal_one_process_in_float64(two_nodes: list[Node], tmp_path: Path) -> None:
    """docs/design.md §3b/§3g across nodes: 2 nodes x 2 processes x 32 images = 1 process x 128, to 1e-9 of the
    update after 3 SGD steps (the float64 runs of tests/test_fp64_invariance.py, Hypersolid's)."""
    argv = method_argv("hypersolid")
    job = Job(two_nodes, 2, [RUNS_WORKER, json.dumps([[*argv, f"run_dir={tmp_path / 'nodes'}"]])], tmp_path / "logs",
              rdzv_id="fp64")
    one = run_processes([RUNS_WORKER, json.dumps([[*argv, f"run_dir={tmp_path / 'one'}"]])], nproc=1, env=ENV)
    assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-5000:]
    assert job.wait(300) == [0, 0], job.tails()
    assert "4 process(es), ddp/gloo" in job.log(0), job.tails()
    gap, moved = update_gap(tmp_path / "one", tmp_path / "nodes", world=4)
    print(f"2 nodes x 2 processes vs 1 process: {gap:.3g} of the update (the update is {moved:.3g} of the weights)")
    assert gap <= TOLERANCE, f"2 nodes x 2 processes differ from 1 process by {gap:.3g} of the update"
    assert moved > 1e-4, f"the weights barely moved ({moved:.3g}): the comparison would prove nothing"
    assert not any(node.pids() for node in two_nodes), "a process was left running in a node"
