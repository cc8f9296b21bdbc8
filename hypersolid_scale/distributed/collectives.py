"""Every collective the package offers; each one is a no-op (or the identity) without a process group.

The repulsion's cross-rank contract (docs/design.md §3) needs one forward collective for the embeddings (an
all_gather of the *detached* rows) and one for the statistics (:func:`all_reduce_packed`). Nothing here is
differentiable on purpose: the loss builds the gradient of the global objective from local rows only, so no
collective runs in its backward. The one differentiable collective, :func:`all_reduce_sum_differentiable`,
serves GlobalBatchNorm's statistics (docs/design.md §3b). The baselines' own gathers are lightly's
(``lightly.utils.dist.gather``), inside the library's losses and in ``methods/barlowtwins.py``.
None of the tensor collectives reads a device value on the host, except the row-count exchange of
:func:`all_gather_detached` for ranks of unequal sizes. The object collectives (:func:`broadcast_object`,
:func:`gather_objects`) pickle small Python values: a path, a run id, RNG states, optimizer shards.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from hypersolid_scale.distributed.process_group import has_process_group


def get_world_size(group: Any = None) -> int:
    """World size of ``group`` (default: the default group); 1 without a process group."""
    return dist.get_world_size(group) if has_process_group() else 1


def get_rank() -> int:
    return dist.get_rank() if has_process_group() else 0


def is_distributed() -> bool:
    """True when a default process group with more than one rank is initialised."""
    return get_world_size() > 1


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def row_counts(n: int, device: torch.device, *, same_size: bool = False) -> list[int]:
    """Every rank's row count, in rank order (``[n]`` without a process group).

    ``same_size=True`` promises that every rank holds ``n`` rows (a trainer's fixed per-rank batch): nothing is
    exchanged. Otherwise the counts are all-gathered and read on the host (a synchronisation on CUDA).
    """
    world = get_world_size()
    if world == 1 or same_size:
        return [n] * world
    count = torch.tensor([n], device=device, dtype=torch.long)
    sizes = [torch.zeros_like(count) for _ in range(world)]
    dist.all_gather(sizes, count)
    return [int(s.item()) for s in sizes]


def all_gather_detached(x: torch.Tensor, *, same_size: bool = False) -> tuple[torch.Tensor, int]:
    """Concatenate ``x`` (detached) from every rank along dim 0.

    Ranks may hold different numbers of rows: their counts are exchanged first and read on the host (a
    synchronisation on CUDA), then the tensors are padded to the largest and trimmed. ``same_size=True``
    promises that every rank holds as many rows as this one (a trainer's fixed per-rank batch), which skips
    that exchange: no host synchronisation at all. Breaking the promise is an error the collective may not
    report, so only pass it where the sizes are equal by construction.

    Shape:
        x: (n_r, ...) on rank r.  Returns ``(gathered, offset)``: gathered is (sum_r n_r, ...) in rank
        order, and ``offset`` is the index of this rank's first row inside it.
    """
    x = x.detach()
    if not is_distributed():
        return x, 0
    world = dist.get_world_size()
    if same_size:
        parts = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=0), dist.get_rank() * x.shape[0]
    counts = row_counts(x.shape[0], x.device)
    n_max = max(counts)
    if x.shape[0] < n_max:
        pad = x.new_zeros((n_max - x.shape[0], *x.shape[1:]))
        x = torch.cat([x, pad], dim=0)
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.contiguous())
    gathered = torch.cat([p[:c] for p, c in zip(parts, counts)], dim=0)
    offset = sum(counts[: dist.get_rank()])
    return gathered, offset


def all_reduce_packed(sums: torch.Tensor, maxes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of ``sums`` and element-wise maximum of ``maxes`` over all ranks, in ONE collective.

    A loss step's statistics need both reductions; instead of two all-reduces, one all_gather of the
    concatenated vector (a few numbers per rank) is reduced locally. The ranks are added in rank order on
    every rank, so all ranks get bit-identical results (decisions taken from them agree). Nothing is read on
    the host. Both inputs are 1-D tensors of the same dtype and device; the outputs are new tensors.
    """
    if sums.dim() != 1 or maxes.dim() != 1 or sums.dtype != maxes.dtype or sums.device != maxes.device:
        raise ValueError(
            f"all_reduce_packed needs two 1-D tensors of one dtype and device, got "
            f"{tuple(sums.shape)} {sums.dtype} {sums.device} and {tuple(maxes.shape)} {maxes.dtype} "
            f"{maxes.device}"
        )
    if not is_distributed():
        return sums.detach().clone(), maxes.detach().clone()
    packed = torch.cat([sums.detach(), maxes.detach()])
    parts = [torch.empty_like(packed) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, packed)
    table = torch.stack(parts)  # (world, n_sums + n_maxes)
    ns = sums.numel()
    return table[:, :ns].sum(dim=0), table[:, ns:].amax(dim=0)


def _all_reduce_copy(x: torch.Tensor, op: Any) -> torch.Tensor:
    out = x.detach().clone()
    if is_distributed():
        dist.all_reduce(out, op=op)
    return out


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum of a detached tensor over all ranks (a copy; the input is left untouched)."""
    return _all_reduce_copy(x, dist.ReduceOp.SUM)


def all_reduce_max(x: torch.Tensor) -> torch.Tensor:
    """Element-wise maximum of a detached tensor over all ranks (a copy)."""
    return _all_reduce_copy(x, dist.ReduceOp.MAX)


def all_reduce_max_flag(flag: bool) -> bool:
    """True on every rank if it is True on any rank (used for preemption: one signalled rank stops all).

    Reads the result on the host: a synchronisation, meant for rare decisions, not for every step.
    """
    if not is_distributed():
        return flag
    # nccl reduces CUDA tensors only; gloo CPU ones.
    on = "cuda" if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor([1.0 if flag else 0.0], device=on)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def broadcast_object(obj: object, src: int = 0) -> object:
    """Rank ``src``'s Python object on every rank (small things: a checkpoint path, a run id)."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def gather_objects(obj: object) -> list[object] | None:
    """Every rank's object, as a list on rank 0 (None elsewhere). Used to collect ZeRO optimizer shards."""
    if not is_distributed():
        return [obj]
    out: list[object] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out


class _AllReduceSum(torch.autograd.Function):
    """y = Σ_ranks x on every rank; backward: grad_x = Σ_ranks grad_y (the adjoint of a sum all-reduce)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        out = x.clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous().clone()  # all_reduce works in place; autograd's buffer may be shared
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)
        return grad, None


def all_reduce_sum_differentiable(x: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Σ_ranks x, differentiable: the backward all-reduces the incoming gradient. Identity on one rank."""
    if get_world_size(group) == 1:
        return x
    return _AllReduceSum.apply(x, group)
