"""Local network helpers shared by the tests that start servers or process groups on 127.0.0.1."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn_ranks(worker: Callable[..., None], world: int, out_dir: Path) -> list[Any]:
    """Run ``worker(rank, port, out_dir)`` in ``world`` spawned processes and return what each saved to
    ``out_dir/rank<r>.pt`` (plain tensors and dicts of this test run's own making)."""
    import torch

    spawn(worker, free_port(), str(out_dir), nprocs=world)
    return [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(world)]


def spawn(worker: Callable[..., None], *args: Any, nprocs: int) -> None:
    """``torch.multiprocessing.spawn(worker, args, nprocs, join=True)``, each rank leaving the way the trainer's
    processes do (hypersolid_scale/safety/process_exit.py: gloo's threads can abort the interpreter's teardown
    after the work is done, about 1 run in 30 on a loaded 2-core machine)."""
    import torch.multiprocessing as mp

    mp.spawn(_rank, args=(worker, *args), nprocs=nprocs, join=True)


def _rank(rank: int, worker: Callable[..., None], *args: Any) -> None:
    from hypersolid_scale.safety.process_exit import leave_now

    worker(rank, *args)
    leave_now(0)  # a spawned child would run the teardown on its way out (exit_process leaves children alone)
