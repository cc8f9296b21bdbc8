"""One writer per run directory (``run_dir/.lock``) and workers that die with their launcher."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _net import free_port
from _warm_python import run_python
from test_train import _finish, _wait_for  # the trainer tests' subprocess helpers

from hypersolid_scale import checkpoint as ck
from hypersolid_scale.safety.errors import UserError
from hypersolid_scale.safety.run_lock import RunDirLocked, RunDirNotADirectory, acquire_run_lock, holds_lock, lock_path

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}

# The real trainer on sklearn digits, shrunk until a step takes milliseconds, without tracking.
TINY = ["data.dataset=digits", "model.in_channels=1", "model.small_cnn.width=4", "method.hypersolid.num_layers=2",
        "method.hypersolid.hidden_dim=32", "method.hypersolid.out_dim=32", "data.num_local_views=2", "data.batch_size_per_gpu=32",
        "data.num_workers=0", "progress=false", "eval.every_n_epochs=0", "dist.device=cpu",
        "tracking.enabled=false", "data.max_pretrain_samples=256"]

_HOLDER = """
import sys, time
from hypersolid_scale.safety.run_lock import acquire_run_lock
acquire_run_lock(sys.argv[1])
print("locked", flush=True)
time.sleep(600)
"""


def _holder(run_dir: Path) -> subprocess.Popen:
    """A process that takes the lock of ``run_dir`` and sleeps (stdlib only: starts in a blink)."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(run_dir)], env=ENV, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def _launch(run_dir: Path, extra: list[str]) -> subprocess.Popen:
    cmd = [sys.executable, str(REPO / "launch" / "train.py"), *TINY, f"run_dir={run_dir}", *extra]
    return subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _refusal_line(out: str, holder_pid: int) -> str:
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, out[-3000:]
    line = errors[0]
    assert f"pid={holder_pid}" in line and f"host={socket.gethostname()}" in line and "since=" in line, line
    assert "wait" in line and "kill" in line and "run_dir=" in line, line
    assert "Traceback" not in out, out[-3000:]
    return line


# ----------------------------------------------------------------------------------------------------------
# The lock itself
# ----------------------------------------------------------------------------------------------------------


def test_lock_is_refused_while_held_and_taken_over_after_sigkill(tmp_path: Path) -> None:
    holder = _holder(tmp_path / "run")
    try:
        with pytest.raises(RunDirLocked, match=rf"pid={holder.pid} since=") as err:
            acquire_run_lock(tmp_path / "run")
        assert "\n" not in str(err.value)
        assert not holds_lock(tmp_path / "run")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    lock = acquire_run_lock(tmp_path / "run")  # the kernel released the dead holder's flock
    try:
        assert holds_lock(tmp_path / "run")
        assert f"pid={os.getpid()} " in lock_path(tmp_path / "run").read_text()
        with pytest.raises(RunDirLocked, match="already locked by this process"):
            acquire_run_lock(tmp_path / "run")
    finally:
        lock.release()
    assert not holds_lock(tmp_path / "run")
    acquire_run_lock(tmp_path / "run").release()  # released means free again


def test_stale_tmp_is_deleted_only_without_a_live_holder(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    tmp = ck.checkpoint_dir(run_dir) / "step_00000010.pt.4242.tmp"
    tmp.parent.mkdir(parents=True)
    tmp.write_bytes(b"being written")
    holder = _holder(run_dir)
    try:
        assert ck.delete_stale_tmp(run_dir) == [] and tmp.exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert ck.delete_stale_tmp(run_dir) == [tmp] and not tmp.exists()


_FORKING_HOLDER = """
import os, sys, time
from hypersolid_scale.safety.run_lock import acquire_run_lock
acquire_run_lock(sys.argv[1])
if os.fork() == 0:  # like a DataLoader worker: outlives a SIGKILLed trainer for a while
    # Said by the child, so that its at-fork handlers (which close its copy of the lock) have run: a holder
    # killed before the child is first scheduled would otherwise leave the lock with the child for a moment.
    print(os.getpid(), flush=True)
    time.sleep(60)
    os._exit(0)
time.sleep(600)
"""


def test_a_forked_child_does_not_keep_a_dead_holders_lock(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", _FORKING_HOLDER, str(tmp_path / "run")], env=ENV,
                              stdout=subprocess.PIPE, text=True)
    child = int(holder.stdout.readline())
    try:
        with pytest.raises(RunDirLocked):
            acquire_run_lock(tmp_path / "run")
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        os.kill(child, 0)  # the child is still alive...
        acquire_run_lock(tmp_path / "run").release()  # ...and the lock is free
    finally:
        os.kill(child, signal.SIGKILL)


# ----------------------------------------------------------------------------------------------------------
# Two trainers on one run_dir; SIGKILL of the holder
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_second_trainer_refuses_and_the_first_finishes_intact(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    extra = ["max_steps=24", "checkpoint.every_n_steps=4", "checkpoint.keep_last=0"]
    first = _launch(run_dir, extra)
    _wait_for(ck.checkpoint_path(run_dir, 4), first)
    # Freeze the first run while the second starts, so that it certainly still holds the lock.
    first.send_signal(signal.SIGSTOP)
    try:
        tmp = ck.checkpoint_dir(run_dir) / f"step_00000008.pt.{first.pid}.tmp"  # as if mid-write
        tmp.write_bytes(b"being written")
        config_mtime = (run_dir / "config.yaml").stat().st_mtime_ns
        # The second trainer, forked with the package imported (its imports are the first one's, just covered).
        second = run_python([REPO / "launch" / "train.py", *TINY, f"run_dir={run_dir}", *extra], env=ENV)
        rc, out = second.returncode, second.stdout + second.stderr
        assert rc == 2, out[-3000:]
        _refusal_line(out, first.pid)
        assert "[hypersolid]" not in out  # it neither resumed nor started
        assert tmp.exists(), "the refused run deleted the live holder's temporary file"
        assert (run_dir / "config.yaml").stat().st_mtime_ns == config_mtime
        tmp.unlink()
    finally:
        first.send_signal(signal.SIGCONT)
    rc, out = _finish(first)
    assert rc == 0, out[-3000:]
    steps = [ck.load_checkpoint(p)["step"] for p in ck.list_checkpoints(run_dir)]
    assert steps == [4, 8, 12, 16, 20, 24]


@pytest.mark.slow
def test_after_sigkill_of_the_holder_a_new_run_takes_the_lock_and_resumes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = _launch(run_dir, ["max_steps=100000", "checkpoint.every_n_steps=5", "checkpoint.keep_last=0"])
    _wait_for(ck.checkpoint_path(run_dir, 5), first)
    assert f"pid={first.pid} " in lock_path(run_dir).read_text()
    first.send_signal(signal.SIGKILL)
    first.wait()
    done = max(ck.load_checkpoint(p)["step"] for p in ck.list_checkpoints(run_dir))
    second = _launch(run_dir, ["max_steps=100000", "checkpoint.every_n_steps=5", "checkpoint.keep_last=0"])
    try:
        _wait_for(ck.checkpoint_path(run_dir, done + 5), second)
        assert f"pid={second.pid} " in lock_path(run_dir).read_text()
    finally:
        second.send_signal(signal.SIGUSR1)  # checkpoint and exit 75
    rc, out = _finish(second, timeout=120)
    assert rc == 75, out[-3000:]
    assert f"resumed from {ck.checkpoint_path(run_dir, done)} at step {done}" in out



@pytest.mark.slow
def test_every_rank_exits_2_on_a_locked_run_dir(tmp_path: Path) -> None:
    """Rank 0 decides and broadcasts: rank 1 must leave with 2 too, not wait in a collective until the timeout.

    Two processes with torchrun's variables (torchrun itself SIGTERMs the other workers as soon as one exits).
    """
    run_dir = tmp_path / "run"
    holder = _holder(run_dir)
    port = free_port()
    try:
        procs = []
        for rank in range(2):
            env = {**ENV, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
            cmd = [sys.executable, str(REPO / "launch" / "train.py"), *TINY, f"run_dir={run_dir}", "max_steps=4"]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        results = [_finish(p, timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert [rc for rc, _ in results] == [2, 2], results
    _refusal_line(results[0][1], holder.pid)
    assert "error:" not in results[1][1] and "Traceback" not in results[1][1], results[1][1]  # rank 0 speaks
    assert not ck.list_checkpoints(run_dir)


_LIFELINE = """
import os, sys
from hypersolid_scale.safety.lifeline import die_with_parent
print(die_with_parent(parent=os.getppid()), die_with_parent(parent=int(sys.argv[1])))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_a_launcher_that_died_before_prctl_is_noticed_only_under_a_launcher() -> None:
    dead_parent = "999999999"  # not our parent: as if the launcher died and we were re-parented
    under = {**ENV, "TORCHELASTIC_RUN_ID": "x"}
    got = subprocess.run([sys.executable, "-c", _LIFELINE, dead_parent], env=under, capture_output=True, text=True)
    assert got.stdout.split() == ["True", "False"], got.stderr
    plain = {k: v for k, v in ENV.items() if k not in ("TORCHELASTIC_RUN_ID", "SLURM_STEP_ID")}
    got = subprocess.run([sys.executable, "-c", _LIFELINE, dead_parent], env=plain, capture_output=True, text=True)
    assert got.stdout.split() == ["True", "True"], got.stderr  # nohup python launch/train.py & must survive


# ----------------------------------------------------------------------------------------------------------
# kill -9 of torchrun's process group
# ----------------------------------------------------------------------------------------------------------


def _processes_with(marker: str, exclude: set[int]) -> list[int]:
    """Live (not zombie) processes whose command line contains ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in exclude:
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmd and state != "Z":
            found.append(int(entry.name))
    return found


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc are Linux-only")
def test_sigkill_of_torchrun_leaves_no_worker_alive(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", str(REPO / "launch" / "train.py"),
           *TINY, f"run_dir={run_dir}", "max_steps=100000", "checkpoint.every_n_steps=5"]
    launcher = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                start_new_session=True)
    workers: list[int] = []
    try:
        _wait_for(ck.checkpoint_path(run_dir, 5), launcher)
        workers = _processes_with(str(run_dir), exclude={launcher.pid, os.getpid()})
        assert len(workers) == 2, workers
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()
        end = time.monotonic() + 15
        while (alive := [p for p in workers if p in _processes_with(str(run_dir), {launcher.pid})]) \
                and time.monotonic() < end:
            time.sleep(0.2)
        assert not alive, f"workers {alive} outlived their killed torchrun"
    finally:
        for pid in _processes_with(str(run_dir), {os.getpid()}):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("inside", [False, True])
def test_a_run_dir_that_is_a_file_is_refused_as_such(tmp_path: Path, inside: bool) -> None:
    """Not a lock problem (no word of flock): the path is a file; it is left as it was."""
    file = tmp_path / "notes.txt"
    file.write_text("keep me")
    run_dir = file / "run" if inside else file
    with pytest.raises(RunDirNotADirectory, match=rf"{file}.* is a file, not a directory; choose another") as err:
        acquire_run_lock(run_dir)
    assert isinstance(err.value, UserError) and isinstance(err.value, NotADirectoryError)
    assert file.read_text() == "keep me" and not holds_lock(run_dir)
    acquire_run_lock(tmp_path / "fine").release()  # the reference: a directory to be is taken
