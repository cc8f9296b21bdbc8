"""launch/slurm/multinode.sbatch on a Slurm of several nodes, each a network namespace of its own (tests/_netns.py).

slurmctld runs in node 0's namespace, one slurmd in each of nodes 1 and 2 (tests/slurm_namespaced.py NamespacedSlurm):
the job's batch script, srun's tasks and the trainer's ranks run in the compute nodes' namespaces, where the node
names resolve to the nodes' addresses and nothing of one node can reach another's loopback. So a job of 2 nodes x 2
ranks that trains to the end has met at MASTER_ADDR (the first node's name, common.sh) and run gloo over the links.
A node whose link is cut mid-run: the other node's ranks stop (heartbeat), Slurm requeues the job once the node is
down, and the job resumes from its newest checkpoint when the node is back.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from slurm_cluster import SlurmUnavailable, unavailable_reason
from slurm_namespaced import NamespacedSlurm
from test_slurm import CPU, SLURM_DIR, TINY, checkpoints, job_env, load_ckpt, log_of, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="network namespaces are Linux's"),
]

JOB_TIMEOUT_S = 240
# One job's settings for both tests: the cut job resumes to the uninterrupted one's weights. In float64: with 4 ranks a
# resumed run differs from an uninterrupted one by float rounding (docs/cluster.md), ~1e-7 in float32.
STEPS, EVERY = 20, 5
JOB = [*TINY, f"max_steps={STEPS}", f"checkpoint.every_n_steps={EVERY}", "tracking.enabled=false",
       "dist.precision=fp64"]


@pytest.fixture(scope="module")
def cluster(network_nodes) -> NamespacedSlurm:
    """Node 0: slurmctld (and the client commands); nodes 1 and 2: a slurmd each. Skipped where it cannot run."""
    reason = unavailable_reason() or (None if shutil.which("nsenter") and shutil.which("unshare")
                                      else "nsenter/unshare (util-linux) missing")
    if reason:
        pytest.skip(f"no local Slurm: {reason}")
    nodes = network_nodes(3)  # skips where namespaces cannot be made
    slurm = NamespacedSlurm(controller=nodes[0], compute=nodes[1:])
    try:
        slurm.start()
    except SlurmUnavailable as err:  # start() has stopped what it started
        shutil.rmtree(slurm.root, ignore_errors=True)
        if os.environ.get("HS_REQUIRE_SLURM") == "1":
            raise
        pytest.skip(f"Slurm on network namespaces could not be started here: {str(err).splitlines()[0]}")
    try:
        yield slurm
    finally:
        slurm.stop()
        shutil.rmtree(slurm.root, ignore_errors=True)


@pytest.fixture(scope="module")
def uninterrupted(cluster: NamespacedSlurm, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, dict, str]:
    """The job on 2 nodes x 2 ranks, trained to the end: (submit dir, job id, its scontrol fields, its log)."""
    where = tmp_path_factory.mktemp("uninterrupted")
    job = cluster.sbatch(*CPU, "--nodes=2", "--ntasks-per-node=2", "--job-name=hs-mn",
                         str(SLURM_DIR / "multinode.sbatch"), *JOB, cwd=where,
                         env=job_env(HS_RUN_DIR=str(where / "run")))
    info = cluster.wait(job, JOB_TIMEOUT_S)
    return where, job, info, log_of(where, f"hs-mn-{job}.out")


def test_multinode_sbatch_trains_four_ranks_on_two_nodes(cluster: NamespacedSlurm, uninterrupted) -> None:
    where, job, info, log = uninterrupted
    context = f"{info}\n{log}\n" + cluster.logs("slurmctld", 15)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", context
    assert info["NodeList"] == "hsn[1-2]" and info["NumNodes"] == "2", context
    # The batch script ran on the first node and met there: MASTER_ADDR is its name (10.231.0.2 in the nodes).
    assert "on hsn[1-2]: 4 ranks, rendezvous hsn1:" in log, log
    assert "4 process(es)" in log and "training finished" in log, log
    # Each node's slurmd launched its tasks of the job's step 0 (srun's: the trainer's ranks, 2 a node).
    for name in cluster.node_names:
        slurmd = cluster.logs(f"slurmd-{name}", tail=200)
        assert f"launch task StepId={job}.0" in slurmd, slurmd
    assert checkpoints(where / "run")[-1] == STEPS, log


def test_node_cut_mid_job_is_requeued_by_slurm_and_resumes(cluster: NamespacedSlurm, uninterrupted,
                                                           tmp_path: Path) -> None:
    """Node 2's link goes down mid-run: node 1's ranks name the lost node and stop (the heartbeat,
    dist.peer_timeout_s); the node is marked down (by an administrator here; Slurm itself after SlurmdTimeout) and
    Slurm requeues the job (--requeue); once the node is back, the job runs on both nodes again and resumes from the
    newest checkpoint, to the uninterrupted job's weights."""
    run_dir = tmp_path / "run"
    steps = STEPS
    node = cluster.compute[1]
    name = cluster.name_of(node)
    job = cluster.sbatch(*CPU, "--nodes=2", "--ntasks-per-node=2", "--job-name=hs-cut",
                         str(SLURM_DIR / "multinode.sbatch"), *JOB, "dist.peer_timeout_s=6",
                         cwd=tmp_path, env=job_env(HS_RUN_DIR=str(run_dir)))
    log_file = tmp_path / f"hs-cut-{job}.out"
    log = lambda: (log_of(tmp_path, log_file.name) + cluster.logs("slurmctld", 20)  # noqa: E731
                   + f"\n{cluster.job(job)}")
    printed = lambda text: log_file.exists() and text in log_file.read_text(errors="replace")  # noqa: E731
    try:
        wait_for(lambda: checkpoints(run_dir), JOB_TIMEOUT_S, "a first checkpoint", log)
        node.cut()
        wait_for(lambda: printed("[hypersolid] lost node 1 (hsn2, 10.231.0.3; ranks 2-3)"), 60,
                 "node 1's ranks to name the lost node", log)
        cut_at = max(checkpoints(run_dir))  # node 1's ranks, rank 0 among them, are gone: no more checkpoints
        assert cut_at < steps, f"the run was done before the cut\n{log()}"
        cluster.run("scontrol", "update", f"nodename={name}", "state=down", "reason=link cut")
        wait_for(lambda: cluster.job(job).get("Restarts") == "1", 60, "Slurm to requeue the job", log)
        # Back on the network, the node's slurmstepd of the cut run (its ranks gone) reports to slurmctld and ends.
        # Only then is the node resumed: the requeued job has the same id and step ids, and a step of the old run
        # still on the node when the new one starts there takes the new one's tasks down with it.
        node.mend()
        wait_for(lambda: not cluster.stepds(node), 60, "the cut run's slurmstepd to end", log)
    finally:
        node.mend()
        cluster.run("scontrol", "update", f"nodename={name}", "state=resume", check=False)
    info = cluster.wait(job, JOB_TIMEOUT_S)
    text = log()
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0" and info["Restarts"] == "1", text
    assert f"requeue job JobId={job} due to failure of node {name}" in cluster.logs("slurmctld", 200), text
    assert "a node was lost (exit code 69, named above); not requeued from here" in text, text
    assert f"job {job} (restart 1) on hsn[1-2]: 4 ranks" in text, text
    resumed = [int(s) for s in re.findall(r"resumed from \S+ at step (\d+)", text)]
    assert resumed == [cut_at] and text.count("starting from scratch") == 1, text
    assert checkpoints(run_dir)[-1] == steps, text
    resumed_weights, whole = load_ckpt(run_dir, steps)["model"], load_ckpt(uninterrupted[0] / "run", steps)["model"]
    assert resumed_weights.keys() == whole.keys()
    gap = max((resumed_weights[k].double() - whole[k].double()).abs().max().item() for k in whole)
    assert gap <= 1e-9, f"the resumed job's weights differ from the uninterrupted job's by {gap:.3g}"
