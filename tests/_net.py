"""Local network helpers shared by the tests that start servers or process groups on 127.0.0.1."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any, Callable


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn_ranks(worker: Callable[..., None], world: int, out_dir: Path) -> list[Any]:
    """Run ``worker(rank, port, out_dir)`` in ``world`` spawned processes and return what each saved to
    ``out_dir/rank<r>.pt`` (plain tensors and dicts of this test run's own making)."""
    import torch
    import torch.multiprocessing as mp

    mp.spawn(worker, args=(free_port(), str(out_dir)), nprocs=world, join=True)
    return [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(world)]
