"""Collectives used by the loss and the evaluation code, no-ops without a process group.

The repulsion's cross-rank contract (DESIGN §3) needs exactly one forward collective: an all_gather of
the *detached* embeddings. Nothing here is differentiable on purpose: the loss builds the gradient of the
global objective from local rows only, so no collective runs in backward.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def is_distributed() -> bool:
    """True when a default process group with more than one rank is initialised."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def get_world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def get_rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def all_gather_detached(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Concatenate ``x`` (detached) from every rank along dim 0.

    Ranks may hold different numbers of rows (the tensors are padded to the largest and trimmed).

    Shape:
        x: (n_r, ...) on rank r.  Returns ``(gathered, offset)``: gathered is (sum_r n_r, ...) in rank
        order, and ``offset`` is the index of this rank's first row inside it.
    """
    x = x.detach()
    if not is_distributed():
        return x, 0
    world = dist.get_world_size()
    n = torch.tensor([x.shape[0]], device=x.device, dtype=torch.long)
    sizes = [torch.zeros_like(n) for _ in range(world)]
    dist.all_gather(sizes, n)
    counts = [int(s.item()) for s in sizes]
    n_max = max(counts)
    if x.shape[0] < n_max:
        pad = x.new_zeros((n_max - x.shape[0], *x.shape[1:]))
        x = torch.cat([x, pad], dim=0)
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.contiguous())
    gathered = torch.cat([p[:c] for p, c in zip(parts, counts)], dim=0)
    offset = sum(counts[: dist.get_rank()])
    return gathered, offset


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum of a detached tensor over all ranks (a copy; the input is left untouched)."""
    out = x.detach().clone()
    if is_distributed():
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def all_reduce_max(x: torch.Tensor) -> torch.Tensor:
    """Element-wise maximum of a detached tensor over all ranks (a copy)."""
    out = x.detach().clone()
    if is_distributed():
        dist.all_reduce(out, op=dist.ReduceOp.MAX)
    return out
