"""``torchrun --max-restarts``: a worker SIGKILLed at any moment makes torchrun restart the group, which resumes
from the newest complete checkpoint and ends bit-identical to an uninterrupted run (docs/design.md §5).

Real torchrun (its default static rendezvous, as a user types it), real SIGKILLs of one worker, never of the
launcher: (a) rank 1 after a step, (b) rank 0 in the middle of writing a checkpoint, both in one run (the group
torchrun restarted after (b) is the one (a) kills). For (b) the checkpoint's
temporary file is a FIFO that this test creates at the name rank 0 will write (``step_<n>.pt.<pid>.tmp``) and
reads nothing from: rank 0 blocks inside ``torch.save`` with part of the file written, and is killed there.
"""

from __future__ import annotations

import fcntl
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from _net import free_port
from _warm_python import run_processes
from test_train import TINY, _wait_for  # the trainer tests' tiny config and subprocess helper

from hypersolid_scale import checkpoint as ck

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mkfifo, F_SETPIPE_SZ and /proc are Linux's"),
]

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
STEPS = 40
# The real trainer on sklearn digits (28 steps per epoch of 2 x 32), shrunk until a step takes milliseconds.
ARGS = [
    *TINY,
    "tracking.enabled=false",
    "deterministic=true",
    f"max_steps={STEPS}",
    "checkpoint.every_n_steps=5",
    "checkpoint.keep_last=0",
]
RESTART_LINE = "[hypersolid] torchrun restart {} of 2 (TORCHELASTIC_RESTART_COUNT / TORCHELASTIC_MAX_RESTARTS)"


def _torchrun(run_dir: Path) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--max-restarts=2",
        f"--master-port={free_port()}",
        str(REPO / "launch" / "train.py"),
        *ARGS,
        f"run_dir={run_dir}",
    ]
    return subprocess.Popen(
        cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def _workers(launcher: int) -> dict[int, int]:
    """{rank: pid} of the launcher's live workers."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        rank = [v[5:] for v in env if v.startswith(b"RANK=")]
        if int(stat[1]) == launcher and stat[0] != "Z" and rank:
            found[int(rank[0])] = int(entry.name)
    return found


def _finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            for pid in _workers(proc.pid).values():
                os.kill(pid, signal.SIGKILL)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out[-5000:]
    return out


def _final(run_dir: Path) -> dict:
    state = ck.load_checkpoint(ck.list_checkpoints(run_dir)[-1])
    assert state["step"] == STEPS
    return state


def _assert_bitwise(got: object, ref: object, where: str) -> None:
    if isinstance(ref, torch.Tensor):
        assert isinstance(got, torch.Tensor) and torch.equal(got, ref), where
    elif isinstance(ref, dict):
        assert isinstance(got, dict) and got.keys() == ref.keys(), where
        for k in ref:
            _assert_bitwise(got[k], ref[k], f"{where}.{k}")
    elif isinstance(ref, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(ref), where
        for i, (g, r) in enumerate(zip(got, ref)):
            _assert_bitwise(g, r, f"{where}[{i}]")
    else:
        assert got == ref, where


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict:
    # The reference only: the same 2-process training under torchrun's agent, its workers forked from the warm
    # test server (what is tested here is the restarted group, started as a user does, below).
    run_dir = tmp_path_factory.mktemp("restart") / "uninterrupted"
    done = run_processes([REPO / "launch" / "train.py", *ARGS, f"run_dir={run_dir}"], nproc=2, env=ENV, timeout=300)
    assert done.returncode == 0 and "torchrun restart" not in done.stdout + done.stderr, done.stderr[-5000:]
    return _final(run_dir)


def test_a_writer_killed_mid_checkpoint_then_a_worker_killed_after_a_step_restart_and_resume_bit_identically(
    tmp_path: Path, uninterrupted: dict
) -> None:
    """Two failures in one run (``--max-restarts=2``): (b) first, then (a) in the group torchrun restarted."""
    run_dir = tmp_path / "run"
    proc = _torchrun(run_dir)
    # (b) Rank 0 killed inside torch.save of step 20: the group restarts from step 15, the one before.
    _wait_for(ck.checkpoint_path(run_dir, 5), proc)  # started: the resume scan and its *.tmp cleanup are done
    writer = _workers(proc.pid)[0]
    fifo = ck.checkpoint_path(run_dir, 20).with_name(f"step_00000020.pt.{writer}.tmp")
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        fcntl.fcntl(reader, fcntl.F_SETPIPE_SZ, 4096)  # far smaller than the checkpoint: the write blocks
        end = time.monotonic() + 240
        while not select.select([reader], [], [], 0.05)[0]:  # readable: rank 0 has written part of the file
            assert proc.poll() is None and time.monotonic() < end, "rank 0 never wrote the checkpoint of step 20"
        os.kill(writer, signal.SIGKILL)
    finally:
        os.close(reader)
    # (a) Rank 1 of the restarted group killed once it has saved step 20 again: a second restart.
    _wait_for(ck.checkpoint_path(run_dir, 20), proc)
    assert writer not in _workers(proc.pid).values()
    os.kill(_workers(proc.pid)[1], signal.SIGKILL)
    saved = [ck.load_checkpoint(p)["step"] for p in ck.list_checkpoints(run_dir)]
    assert max(saved) < STEPS, "the run finished before the second kill; the test proves nothing"

    out = _finish(proc)
    assert [out.count(RESTART_LINE.format(n)) for n in (1, 2)] == [1, 1], out[-5000:]
    resumed = [int(part.split(".pt")[0]) for part in out.split(f"resumed from {ck.checkpoint_dir(run_dir)}/step_")[1:]]
    assert len(resumed) == 2 and resumed[0] == 15 and resumed[1] in range(20, STEPS, 5), (resumed, out[-5000:])
    assert not fifo.exists() and not list(ck.checkpoint_dir(run_dir).glob("*.tmp")), "a stale temporary file"
    got = _final(run_dir)
    for key in ("model", "method", "optimizer", "loader"):
        _assert_bitwise(got[key], uninterrupted[key], key)
