"""The ring exchange: every rank's block of rows visits every other rank in P − 1 point-to-point hops.

The ``ring`` repulsion backend (docs/design.md §3f) needs each rank's rows to meet every other rank's rows once,
without any rank holding all of them. At hop h rank r holds the block of rank (r − h) mod P; it sends that block
to rank r + 1 and receives the next one from rank r − 1 (``batch_isend_irecv``: gloo and nccl), and the caller
computes on the block it holds while that transfer runs. A rank holds at most two blocks (the current one and
the one in flight) whatever P is, and sends and receives (P − 1) blocks a pass: the bytes of an all_gather,
without its P blocks held at once.

Blocks may differ in size per rank (``collectives.row_counts``); a block of 0 rows is not sent at all (both ends know
the sizes, so they skip the same hop). Nothing here is differentiable: the rows travel detached (§3).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as dist

from hypersolid_scale.distributed.collectives import get_rank, get_world_size, is_distributed


def ring_pass(block: torch.Tensor, counts: list[int]) -> Iterator[tuple[int, torch.Tensor]]:
    """Yield ``(source_rank, rows)`` for every rank's block, this rank's own first, then one per hop.

    ``block``: this rank's rows (n, ...), sent as they are (their dtype is what travels); ``counts[s]``: the rows
    of rank s's block. Before a block is yielded, its send to the next rank and the receive of the following
    block are posted, so the caller's work on it overlaps the transfer; the generator waits for both before it
    yields the next block. Every rank must consume the whole pass (the hops pair up across ranks).
    """
    block = block.detach().contiguous()
    if not is_distributed():
        yield 0, block
        return
    world, rank = get_world_size(), get_rank()
    if len(counts) != world or counts[rank] != block.shape[0]:
        raise ValueError(f"ring_pass: rank {rank} holds {block.shape[0]} rows, counts {counts} for {world} ranks")
    to_rank, from_rank = (rank + 1) % world, (rank - 1) % world
    src, cur = rank, block
    for hop in range(world):
        last = hop == world - 1
        nxt_src = (src - 1) % world
        incoming = None if last else cur.new_empty((counts[nxt_src], *cur.shape[1:]))
        ops = []
        if not last and cur.shape[0]:
            ops.append(dist.P2POp(dist.isend, cur, to_rank))
        if incoming is not None and incoming.shape[0]:
            ops.append(dist.P2POp(dist.irecv, incoming, from_rank))
        requests = dist.batch_isend_irecv(ops) if ops else []
        yield src, cur  # computed on while the next block is in flight
        for req in requests:
            req.wait()
        if incoming is not None:
            src, cur = nxt_src, incoming
