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
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch
from _netns import DEV, Node
from _warm_python import run_processes
from test_fp64_invariance import TOLERANCE, method_argv, update_gap
from test_torchrun_restart import RESTART_LINE, _assert_bitwise
from test_train import TINY

from hypersolid_scale import checkpoint as ck
from hypersolid_scale.distributed import EXIT_PEER_LOST

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="network namespaces are Linux's"),
]

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
RDZV_PORT = 29400  # inside the nodes' own namespaces: nothing else listens there
RUNS_WORKER = str(REPO / "tests" / "_runs_worker.py")  # trains a list of runs, writing each one's initial.pt


def agent(node: Node, host: Node, nproc: int, argv: Sequence[str], log: Path, *, rdzv_id: str, nnodes: str,
          torchrun: Sequence[str] = (), conf: str = "", env: dict[str, str] | None = None) -> subprocess.Popen:
    """Node ``node``'s torchrun agent, in its namespace, the rendezvous hosted by ``host``; output in ``log``."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--nproc_per_node={nproc}",
           "--rdzv-backend=c10d", f"--rdzv-endpoint={host.addr}:{RDZV_PORT}", f"--rdzv-id={rdzv_id}",
           f"--rdzv-conf=is_host={int(node is host)}{conf}", f"--local-addr={node.addr}", *torchrun, *argv]
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        return node.popen(cmd, env={**ENV, "GLOO_SOCKET_IFNAME": DEV, **(env or {})}, stdout=out,
                          stderr=subprocess.STDOUT, cwd=REPO)


class Job:
    """One torchrun agent per node, each in its node's namespace, its output in ``<log_dir>/node<i>.log``."""

    def __init__(self, nodes: Sequence[Node], nproc: int, argv: Sequence[str], log_dir: Path, *, rdzv_id: str,
                 torchrun: Sequence[str] = ()) -> None:
        self.nodes, self.logs = list(nodes), [log_dir / f"node{n.index}.log" for n in nodes]
        self.procs = [agent(node, nodes[0], nproc, argv, log, rdzv_id=rdzv_id, nnodes=str(len(nodes)),
                            torchrun=torchrun) for node, log in zip(self.nodes, self.logs)]

    def log(self, i: int) -> str:
        return self.logs[i].read_text(errors="replace")

    def tails(self) -> str:
        return "\n".join(f"--- node {i}:\n{self.log(i)[-3000:]}" for i in range(len(self.nodes)))

    def wait_for(self, path: Path, timeout: float = 240) -> None:
        """Until ``path`` exists, every agent still running."""
        end = time.monotonic() + timeout
        while not path.exists():
            assert all(p.poll() is None for p in self.procs), f"the job ended before {path.name}:\n{self.tails()}"
            assert time.monotonic() < end, f"no {path} after {timeout} s:\n{self.tails()}"
            time.sleep(0.02)

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


_CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
    print("connected")
except OSError as err:
    print(type(err).__name__)
"""

_LISTEN = """
import socket, sys, time
listening = []
for addr in ("127.0.0.1", sys.argv[1]):  # on the node's loopback and on its own address
    listening.append(socket.create_server((addr, int(sys.argv[2]))))
print("listening", flush=True)
time.sleep(60)
"""


def _connect(node: Node, addr: str, port: int, timeout: float = 1.0) -> str:
    done = subprocess.run(["ip", "netns", "exec", node.netns, sys.executable, "-c", _CONNECT, addr, str(port),
                           str(timeout)], capture_output=True, text=True, timeout=30)
    return done.stdout.strip() or done.stderr[-500:]


def test_three_nodes_reach_one_another_over_their_links_only(network_nodes) -> None:
    """The fixture's nodes: each reaches the others' addresses; nobody reaches another node's loopback; a cut
    node's packets go nowhere (a timeout, not a refusal: nothing tells the others)."""
    nodes = network_nodes(3)
    port = 29500
    server = nodes[2].popen([sys.executable, "-c", _LISTEN, nodes[2].addr, str(port)], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert server.stdout.readline().strip() == "listening"
        assert [_connect(n, nodes[2].addr, port) for n in nodes[:2]] == ["connected", "connected"]
        assert _connect(nodes[0], "127.0.0.1", port) == "ConnectionRefusedError"  # node 0's own loopback
        nodes[2].cut()
        assert _connect(nodes[0], nodes[2].addr, port) == "TimeoutError"
        nodes[2].mend()
        assert _connect(nodes[1], nodes[2].addr, port, timeout=5) == "connected"
    finally:
        server.kill()
        server.wait()


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


# ---------------------------------------------------------------------------------------------------------------
# A lost node: killed (its agent and workers at once), or cut off (its link down). The survivors stop within
# dist.peer_timeout_s (hypersolid_scale/distributed/heartbeat.py) with one line naming it, and a rerun resumes.
# ---------------------------------------------------------------------------------------------------------------

PEER_TIMEOUT_S = 3
STEPS = 20
LOST_ARGS = [*TINY, "data.batch_size_per_gpu=8", "tracking.enabled=false", "deterministic=true", f"max_steps={STEPS}",
             "checkpoint.every_n_steps=5", "checkpoint.keep_last=0", f"dist.peer_timeout_s={PEER_TIMEOUT_S}"]
TRAIN = str(REPO / "launch" / "train.py")


def _saved(run_dir: Path) -> list[int]:
    return [int(p.stem.split("_")[1]) for p in ck.list_checkpoints(run_dir)]


def _lose_node(job: Job, run_dir: Path, how: str) -> dict:
    """Once the job has saved a checkpoint, node 1 is killed or cut: what node 0 did, and how long it took."""
    after = max(_saved(run_dir), default=0)
    job.wait_for(ck.checkpoint_path(run_dir, after + 5))
    lost_at = time.monotonic()
    if how == "cut":
        job.nodes[1].cut()
    else:
        assert job.nodes[1].kill_all(), "node 1 runs nothing"
    try:
        code = job.procs[0].wait(timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"node 0 still runs 60 s after node 1 was {how}:\n{job.tails()}") from None
    stopped = time.monotonic() - lost_at
    end = time.monotonic() + 10  # the agent has reaped its workers; anything else of node 0 is a leftover
    while job.nodes[0].pids() and time.monotonic() < end:
        time.sleep(0.05)
    left = job.nodes[0].pids()
    # The node that was cut off finds itself alone (the store is on node 0): its workers stop too. Its torchrun
    # agent keeps trying to reach the store for minutes; it is killed here once its workers are gone.
    agent1, end = job.procs[1].pid, time.monotonic() + 30
    while set(job.nodes[1].pids()) - {agent1} and time.monotonic() < end:
        time.sleep(0.05)
    node1_workers = sorted(set(job.nodes[1].pids()) - {agent1})
    node1_stopped = time.monotonic() - lost_at
    job.nodes[1].kill_all()
    if how == "cut":
        job.nodes[1].mend()
    return {"code": code, "stopped_s": stopped, "left": left, "log": job.log(0), "saved": _saved(run_dir),
            "node1_workers": node1_workers, "node1_stopped_s": node1_stopped, "node1_log": job.log(1),
            "tails": job.tails()}


@pytest.fixture(scope="module")
def lost_node(two_nodes: list[Node], tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One run on 2 nodes x 1 process: node 1 cut off after a checkpoint; rerun, node 1 killed after the next
    one; rerun to the end, with one of its workers killed on the way (torchrun restarts the group). And the same
    training uninterrupted on one node of 2 processes. (One process per node: with 4 ranks a resumed DDP run is not
    bit-identical even on one node, see docs/cluster.md.)"""
    root = tmp_path_factory.mktemp("lost_node")
    run_dir = root / "run"
    ref = run_processes([TRAIN, *LOST_ARGS, f"run_dir={root / 'ref'}"], nproc=2, env=ENV, timeout=300)
    assert ref.returncode == 0, ref.stdout[-3000:] + ref.stderr[-5000:]
    found = {}
    for how in ("cut", "killed"):
        job = Job(two_nodes, 1, [TRAIN, *LOST_ARGS, f"run_dir={run_dir}"], root / how, rdzv_id=how)
        found[how] = _lose_node(job, run_dir, how)
    # The rerun may restart (--max-restarts=2): its worker on node 1 is killed once it has saved a checkpoint.
    rerun = Job(two_nodes, 1, [TRAIN, *LOST_ARGS, f"run_dir={run_dir}"], root / "rerun", rdzv_id="rerun",
                torchrun=["--max-restarts=2"])
    rerun.wait_for(ck.checkpoint_path(run_dir, max(_saved(run_dir)) + 5))
    worker = [pid for pid in two_nodes[1].pids() if pid != rerun.procs[1].pid]
    assert len(worker) == 1, worker
    os.kill(worker[0], signal.SIGKILL)
    killed_at, before = time.monotonic(), max(_saved(run_dir))
    assert before < STEPS, "the rerun finished before its worker was killed: the restart proves nothing"
    rerun.wait_for(ck.checkpoint_path(run_dir, before + 5))
    found["restart_s"] = time.monotonic() - killed_at  # the kill to the first checkpoint after it (5 steps on)
    assert rerun.wait(300) == [0, 0], rerun.tails()
    found["rerun"] = rerun.log(0)
    found["final"] = ck.load_checkpoint(ck.list_checkpoints(run_dir)[-1])
    found["ref"] = ck.load_checkpoint(ck.list_checkpoints(root / "ref")[-1])
    return found


@pytest.mark.parametrize("how", ["cut", "killed"])
def test_a_lost_node_stops_the_others_within_the_peer_timeout_with_one_line(lost_node: dict, how: str) -> None:
    seen = lost_node[how]
    print(f"node 1 {how}: node 0 stopped after {seen['stopped_s']:.1f} s, node 1's workers after "
          f"{seen['node1_stopped_s']:.1f} s")
    assert seen["code"] != 0, seen["tails"]
    # 3 s of silence, judged every 0.3 s, then torchrun's agent reports and leaves; the collective timeout is 30 min
    assert seen["stopped_s"] < PEER_TIMEOUT_S + 12, seen["tails"]
    lines = [line for line in seen["log"].splitlines() if line.startswith("[hypersolid] lost ")]  # not torchrun's
    assert len(lines) == 1, seen["tails"]
    line = lines[0]
    assert "lost node 1 (" in line and "10.231.0.2; rank 1)" in line, line
    assert f"dist.peer_timeout_s={PEER_TIMEOUT_S}" in line and f"exit code {EXIT_PEER_LOST}" in line, line
    assert f"step_{max(seen['saved']):08d}.pt; a rerun resumes from it" in line, (line, seen["saved"])
    assert seen["left"] == [], f"node 0 still runs {seen['left']} after node 1 was {how}"
    assert seen["node1_workers"] == [], f"node 1's workers {seen['node1_workers']} still run after it was {how}"
    if how == "cut":  # the cut node says why it stopped
        assert "[hypersolid] lost the rendezvous store at 10.231.0.1:" in seen["node1_log"], seen["tails"]


def test_a_rerun_after_the_lost_nodes_restarts_across_nodes_and_ends_bit_identical_to_the_uninterrupted_run(
    lost_node: dict,
) -> None:
    """The rerun resumes from the newest checkpoint; a worker of it killed on node 1 makes both agents restart
    (torchrun --max-restarts=2: the group meets again, docs/design.md §5), and the run ends bit-identical."""
    print(f"rerun: a worker killed on node 1; the first checkpoint after it (5 steps on) "
          f"{lost_node['restart_s']:.1f} s later")
    log = lost_node["rerun"]
    resumed = [int(part.split(".pt")[0]) for part in log.split("resumed from ")[1:] if "step_" in part
               for part in [part.split("step_")[1]]]
    assert len(resumed) == 2 and resumed[0] == max(lost_node["killed"]["saved"]), log[-3000:]
    assert log.count(RESTART_LINE.format(1)) == 1 and resumed[1] > resumed[0], log[-3000:]
    got, ref = lost_node["final"], lost_node["ref"]
    assert got["step"] == ref["step"] == STEPS and got["world_size"] == ref["world_size"] == 2
    for key in ("model", "method", "optimizer", "loader"):
        _assert_bitwise(got[key], ref[key], key)


# ---------------------------------------------------------------------------------------------------------------
# Elastic (--nnodes=1:2): a node that starts late is waited for; a lost node leaves the other training alone at the
# same global batch; the node that comes back is taken in, although the agents' restart counts now differ.
# ---------------------------------------------------------------------------------------------------------------

ELASTIC_STEPS = 30
ELASTIC_ARGS = [*(a for a in TINY if not a.startswith("data.batch_size_per_gpu=")), "data.global_batch_size=16",
                "dist.precision=fp64", "optim.name=sgd", "tracking.enabled=false", "deterministic=true",
                f"max_steps={ELASTIC_STEPS}", "checkpoint.every_n_steps=5", "checkpoint.keep_last=0"]
LAST_CALL_S = 3  # the rendezvous waits this long for more nodes once it has its minimum (torch's default: 30)
# A dead node leaves the rendezvous after keep_alive_interval x keep_alive_max_attempt silent seconds (torch: 5 x 3)
KEEP_ALIVE = ",keep_alive_interval=1,keep_alive_max_attempt=3"


def _until(what: str, done: Callable[[], bool], agents: Sequence[subprocess.Popen], logs: Sequence[Path],
           timeout: float = 180) -> None:
    end = time.monotonic() + timeout
    while not done():
        tails = lambda: "\n".join(f"--- {p.name}:\n{p.read_text(errors='replace')[-3000:]}" for p in logs)  # noqa: E731
        assert all(a.poll() is None for a in agents), f"an agent ended before {what}:\n{tails()}"
        assert time.monotonic() < end, f"no {what} after {timeout} s:\n{tails()}"
        time.sleep(0.02)


def _resumed_at(log: str) -> int:
    return int(log.rsplit("resumed from ", 1)[1].split(" at step ")[1].split()[0].rstrip(".,:;"))


@pytest.fixture(scope="module")
def elastic(two_nodes: list[Node], tmp_path_factory: pytest.TempPathFactory) -> dict:
    """2 nodes x 1 process, ``--nnodes=1:2 --max-restarts=3``, a global batch of 16: node 1 starts a second after
    node 0; once a checkpoint is saved, node 1 is killed (agent and workers); node 0 restarts alone (its restart 1)
    and trains on; once it has saved a checkpoint alone, its worker is held (SIGSTOP) while node 1 starts anew (its
    agent's count: 0), until node 0's agent sees the waiting node; then the group of 2 trains to the end. And one
    process resumed from the checkpoint node 0 resumed from, to the checkpoint node 0 saved alone."""
    n0, n1 = two_nodes
    root = tmp_path_factory.mktemp("elastic")
    run_dir, logs = root / "run", [root / "logs" / name for name in ("node0.log", "node1.log", "node1_again.log")]
    argv = [TRAIN, *ELASTIC_ARGS, f"run_dir={run_dir}"]
    # INFO: the agent says when it restarts for a waiting node. TORCH_DISABLE_SHARE_RDZV_TCP_STORE: a node new to a
    # later round otherwise waits for its address until the store times out (docs/cluster.md, "Elastic").
    opts = {"rdzv_id": "elastic", "nnodes": "1:2", "torchrun": ["--max-restarts=3"],
            "conf": f",last_call_timeout={LAST_CALL_S}{KEEP_ALIVE}",
            "env": {"LOGLEVEL": "INFO", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}}
    text = lambda i: logs[i].read_text(errors="replace") if logs[i].exists() else ""  # noqa: E731
    a0 = agent(n0, n0, 1, argv, logs[0], **opts)
    try:
        time.sleep(1.0)  # late, within the rendezvous' last call
        a1 = agent(n1, n0, 1, argv, logs[1], **opts)
        _until("a checkpoint of the 2 nodes", lambda: max(_saved(run_dir), default=0) >= 5, [a0, a1], logs[:2])
        assert n1.kill_all(), "node 1 runs nothing"
        restart = RESTART_LINE.format(1).replace("of 2", "of 3")
        _until("node 0's first checkpoint alone", lambda: restart in text(0) and "resumed from " in
               text(0).split(restart)[1] and max(_saved(run_dir)) >= _resumed_at(text(0)) + 5, [a0], logs[:1])
        alone = text(0).split(restart)[1]
        held = [pid for pid in n0.pids() if pid != a0.pid]
        for pid in held:
            os.kill(pid, signal.SIGSTOP)
        saved_alone = max(_saved(run_dir))
        again = agent(n1, n0, 1, argv, logs[2], **opts)
        _until("node 0's agent seeing node 1 again", lambda: "new nodes from group_rank" in text(0), [a0, again],
               [logs[0], logs[2]])
        for pid in held:
            os.kill(pid, signal.SIGCONT)
        for proc in (a0, again):
            proc.wait(timeout=240)
        found = {"codes": [a0.returncode, again.returncode], "logs": [text(i) for i in range(3)], "alone": alone,
                 "saved_alone": saved_alone, "run_dir": run_dir}
    finally:
        for node in two_nodes:
            node.kill_all()
    start = _resumed_at(alone)
    ref = run_processes([TRAIN, *ELASTIC_ARGS, f"run_dir={root / 'ref'}", f"max_steps={saved_alone}",
                         f"checkpoint.path={ck.checkpoint_path(run_dir, start)}"], nproc=1, env=ENV, timeout=300)
    assert ref.returncode == 0, ref.stdout[-3000:] + ref.stderr[-5000:]
    found["ref"] = {(d, s): ck.load_checkpoint(ck.checkpoint_path(root / d, s)) for d, s in
                    (("run", start), ("run", saved_alone), ("ref", saved_alone))}
    return found


def test_elastic_nodes_wait_for_a_late_one_and_carry_on_without_a_lost_one_at_the_same_global_batch(
    elastic: dict,
) -> None:
    """The first group has both nodes (node 1 started a second late); after node 1 is killed node 0 trains alone at
    the same global batch, equal in float64 to one process resumed from the same checkpoint (to 1e-9 of the
    update, design §3g)."""
    first, alone = elastic["logs"][0].split("torchrun restart 1")[0], elastic["alone"]
    assert "2 process(es)" in first and "1 process(es)" in alone, elastic["logs"][0][-3000:]
    start, saved = _resumed_at(alone), elastic["saved_alone"]
    ckpts = elastic["ref"]
    assert ckpts[("run", start)]["world_size"] == 2 and ckpts[("run", saved)]["world_size"] == 1
    base, got, want = (ckpts[k]["model"] for k in (("run", start), ("run", saved), ("ref", saved)))
    keys = [k for k, v in base.items() if torch.is_floating_point(v)]
    assert got[keys[0]].dtype == torch.float64
    norm = lambda d: sum(float((d[k]).pow(2).sum()) for k in keys) ** 0.5  # noqa: E731
    gap = norm({k: got[k] - want[k] for k in keys}) / norm({k: want[k] - base[k] for k in keys})
    print(f"node 0 alone vs 1 process resumed from step {start}: {gap:.3g} of the update to step {saved}")
    assert gap <= TOLERANCE, f"node 0 alone differs from 1 process by {gap:.3g} of the update"


def test_a_node_back_joins_the_elastic_group_although_the_agents_restart_counts_differ(elastic: dict) -> None:
    """Node 0's agent has counted one restart, node 1's new agent none: the group of 2 meets all the same and
    trains to the end (here each round has a store of its own; through a store shared by the rounds the ranks
    agree on their prefix, process_group.attempt_token, tests/test_engines.py)."""
    log0, _, back = elastic["logs"]
    assert elastic["codes"] == [0, 0], "\n".join(log[-3000:] for log in elastic["logs"])
    assert "torchrun restart 1 of 3" in log0 and "torchrun restart" not in back, back[-3000:]
    final = ck.load_checkpoint(ck.list_checkpoints(elastic["run_dir"])[-1])
    assert final["step"] == ELASTIC_STEPS and final["world_size"] == 2
    assert _resumed_at(log0) > elastic["saved_alone"] - 1, log0[-3000:]
