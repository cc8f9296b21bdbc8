"""Workers die with their launcher while they start, too: a worker still importing when torchrun is killed
must not go on to wait out ``dist.timeout_minutes`` connecting to the store that torchrun hosted, and one
already waiting in the rendezvous must not outlive it either."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _net import free_port
from test_run_lock import ENV, REPO, TINY, _processes_with

# Rank 1 never starts training (it sleeps, its command line carrying the marker), so rank 0 waits for it in
# init_process_group: the moment of startup when a Python signal handler cannot run.
_STALL_RANK_1 = 'if [ "$LOCAL_RANK" = 1 ]; then exec "$0" -c "import time; time.sleep(300)" "$@"; fi; exec "$0" "$@"'


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def _wait_until_blocked(pid: int, launcher: subprocess.Popen, timeout: float = 180) -> None:
    """Until ``pid`` has used no CPU for 3 s: its imports are done and it waits (in the rendezvous)."""
    end, last, still_since = time.monotonic() + timeout, -1, time.monotonic()
    while time.monotonic() < end:
        assert launcher.poll() is None, "torchrun exited before its worker reached the rendezvous"
        ticks = _cpu_ticks(pid)
        if ticks != last:
            last, still_since = ticks, time.monotonic()
        elif time.monotonic() - still_since > 3:
            return
        time.sleep(0.2)
    raise AssertionError(f"worker {pid} never stopped using CPU")


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc are Linux-only")
@pytest.mark.parametrize("moment", ["importing", "rendezvous"])
def test_sigkill_of_torchrun_during_startup_leaves_no_worker(tmp_path: Path, moment: str) -> None:
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
           "--no-python", "sh", "-c", _STALL_RANK_1, sys.executable, str(REPO / "launch" / "train.py"), *TINY,
           f"run_dir={run_dir}", "dist.timeout_minutes=30"]
    launcher = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        end = time.monotonic() + 60
        while len(workers := _processes_with(str(run_dir), {launcher.pid, os.getpid()})) < 2:
            assert time.monotonic() < end and launcher.poll() is None, "torchrun did not start its workers"
            time.sleep(0.2)
        trainer = [p for p in workers if "launch/train.py" in Path(f"/proc/{p}/cmdline").read_text()
                   and "time.sleep" not in Path(f"/proc/{p}/cmdline").read_text()]
        assert len(trainer) == 1, workers
        if moment == "rendezvous":
            _wait_until_blocked(trainer[0], launcher)
        assert not run_dir.exists() or not any(run_dir.iterdir())  # still starting: nothing written yet
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()
        end = time.monotonic() + 10
        while trainer[0] in _processes_with(str(run_dir), {launcher.pid}) and time.monotonic() < end:
            time.sleep(0.2)
        assert trainer[0] not in _processes_with(str(run_dir), {launcher.pid}), \
            "a worker waiting in the rendezvous outlived its killed torchrun"
    finally:
        for pid in _processes_with(str(run_dir), {os.getpid()}):
            os.kill(pid, signal.SIGKILL)


_EXIT_CODE = """
import atexit, sys
from hypersolid_scale.safety.process_exit import exit_process

class Late:
    def __del__(self):
        print("teardown ran", flush=True)

late = Late()
atexit.register(lambda: print("atexit ran"))
sys.stdout.write("unflushed;")
if sys.argv[1] == "group":
    import torch
    from hypersolid_scale.distributed import cleanup, ensure_process_group
    ensure_process_group(torch.device("cpu"))  # a one-rank gloo group, as DeepSpeed on one process makes
    cleanup()
exit_process(3)
"""


@pytest.mark.parametrize("kind", ["plain", "group"])
def test_a_process_that_made_a_process_group_leaves_without_the_interpreter_teardown(kind: str) -> None:
    """safety/process_exit.py: gloo's threads can abort the interpreter's teardown (SIGABRT after the work is
    done), so a process that created a group skips it; what a user relies on stays: the exit code, the atexit
    handlers, the buffered output. A process without a group exits as usual (the teardown runs)."""
    proc = subprocess.run([sys.executable, "-c", _EXIT_CODE, kind], capture_output=True, text=True, timeout=300,
                          cwd=REPO, env={**ENV, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert proc.stdout.startswith("unflushed;atexit ran"), proc.stdout
    assert ("teardown ran" in proc.stdout) == (kind == "plain"), proc.stdout
