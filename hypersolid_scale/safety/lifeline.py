"""Workers die with their launcher: ``prctl(PR_SET_PDEATHSIG)`` plus a check for a launcher already gone.

torchrun starts each worker in its own session, so ``kill -9`` of torchrun's process group does not reach
them: they are re-parented and train on, writing checkpoints into a run directory that the user may
already have restarted. Asking the kernel to send SIGTERM when the parent dies turns that into the
ordinary preemption path (the trainer finishes its step, checkpoints and exits 75). Under srun the parent
is slurmstepd and the same applies. While a worker starts, launch/train.py asks for SIGKILL instead: there
is nothing to checkpoint yet, and a worker blocked in the rendezvous with a dead launcher's store runs no
Python signal handler; the trainer switches to SIGTERM once its process group is up.

Only under a launcher (torchrun's ``TORCHELASTIC_RUN_ID``, srun's ``SLURM_STEP_ID``): a plain
``nohup python launch/train.py &`` must outlive the shell that started it.

Stdlib only: this runs before torch is imported, to leave the smallest window in which the launcher can
die unnoticed.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Mapping

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
EXIT_ORPHANED = 128 + signal.SIGTERM  # as if killed by the SIGTERM the launcher's death should have sent


def under_launcher(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return "TORCHELASTIC_RUN_ID" in env or ("SLURM_STEP_ID" in env and "SLURM_PROCID" in env)


def _pid1_is_launcher() -> bool:
    # In a container the launcher itself may be pid 1 (docker run ... torchrun ...): then ppid 1 is normal.
    try:
        with open("/proc/1/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ")
    except OSError:
        return True  # cannot tell: never kill a healthy worker on a guess
    return any(name in cmd for name in (b"torchrun", b"torch.distributed.run", b"slurmstepd"))


def die_with_parent(sig: int = signal.SIGTERM, parent: int | None = None, *, always: bool = False) -> bool:
    """Have the kernel send ``sig`` to this process when its parent dies; returns False if the parent is gone.

    ``parent`` is the parent pid recorded as early as possible; the parent may have died before ``prctl``
    took effect (no signal will come then), which shows as a changed parent pid, or, if it died even before
    ``parent`` was recorded, as being re-parented to pid 1. No-op (True) off Linux or outside a launcher,
    unless ``always`` (a process that starts its own children, e.g. the comparison's trainings, and wants them
    to end with it: call it in the child before ``exec``; the setting survives ``exec``).
    """
    if not sys.platform.startswith("linux") or not (always or under_launcher()):
        return True
    parent = os.getppid() if parent is None else parent
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        print(
            f"warning: prctl(PR_SET_PDEATHSIG) failed ({os.strerror(err)}); this worker will not stop when "
            "its launcher is killed",
            file=sys.stderr,
        )
        return True
    now = os.getppid()
    if now != parent:
        return False
    return not (now == 1 and os.getpid() != 1 and not _pid1_is_launcher())
