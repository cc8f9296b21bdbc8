"""Repulsion backends: the row part of the short-range repulsion, over local rows × global columns.

Every backend computes, for the rows this process owns (``x_rows``, L2-normalised, differentiable) against
the detached columns of the global batch (``x_all``),

    L_r = Σ_{i ∈ rows} Σ_{j ≠ i, pair allowed} ReLU(x_i · x_j − α)

and returns it as a differentiable scalar whose gradient w.r.t. ``x_rows`` is the *row part* only (the
columns are constants). :class:`~hypersolid_scale.losses.HypersolidLoss` doubles it, because the similarity
matrix is symmetric (docs/design.md §3).

* ``dense``: materialises the (m, M_g) similarity matrix and lets autograd do the rest. It is the
  paper-parity reference and the easiest code to trust; its memory is O(m · M_g).
* ``tiled``: walks (tile × tile) blocks without autograd and accumulates, next to the value, the gradient
  rows ``Y_i = Σ_{j active} x_j`` (ReLU is piecewise linear, so ∂L_r/∂x_i is exactly Y_i). A tiny custom
  ``autograd.Function`` hands Y back in backward, so backward costs nothing extra and no block is kept
  alive: peak memory is one block plus Y (the size of the embeddings), never an (M × M) matrix.

No backend reads a device value on the host: telemetry accumulates in device tensors
(:class:`RepulsionStats`), so a CUDA step is never stalled here (the loop bounds are host integers). On the
CPU, where reading a tensor costs nothing, ``tiled`` skips the rows of a block with no active pair.

Thresholds are always decided in float32 or better (docs/design.md §2): callers upcast bf16/fp16 input.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

REPEL_MODES = ("all", "negatives", "positives")  # which pairs are repelled: all (the paper), or one kind


@dataclass(frozen=True)
class PairLayout:
    """Where this process's rows sit in the global batch, and which pairs are repelled.

    Rows are ``feats.reshape(B * V, D)``: row ``g`` of the global batch is view ``g % V`` of image ``g // V``.
    """

    offset: int  # global index of this process's first row
    views: int  # V, views per image (identical on every rank)
    mode: str = "all"  # "all" | "negatives" (other images only) | "positives" (same image only)

    def __post_init__(self) -> None:
        if self.mode not in REPEL_MODES:
            raise ValueError(f"repel mode {self.mode!r} is not valid; choose one of {', '.join(REPEL_MODES)}")


@dataclass
class RepulsionStats:
    """Telemetry of one call for this process's rows, as 0-dim float64 device tensors (ordered pairs).

    Summed across ranks by the caller (``max_cos``: maximum).
    """

    active_pos: torch.Tensor  # same-image pairs with cosine > alpha
    active_neg: torch.Tensor  # different-image pairs with cosine > alpha
    max_cos: torch.Tensor  # largest off-diagonal cosine seen (-1 when there is no pair)
    candidates: torch.Tensor  # neighbors: pairs returned by the search
    saturated_rows: torch.Tensor  # rows that may have more active neighbours than k (see ``saturation_k``)
    recall_hits: torch.Tensor  # neighbors, on a measuring call: sampled active pairs the search found
    recall_total: torch.Tensor  # ... and all sampled active pairs
    recall_measured: torch.Tensor  # 1 on a call that measured recall, else 0
    exact_rows: torch.Tensor  # screen=bf16: this rank's rows sent again in full precision (docs/design.md §2)

    @classmethod
    def zeros(cls, device: torch.device) -> RepulsionStats:
        z = torch.zeros(9, dtype=torch.float64, device=device)
        z.narrow(0, 2, 1).fill_(-1.0)  # max_cos. (``z[2] = -1.0`` would copy a host scalar: a CUDA sync)
        return cls(*z.unbind(0))


def _f64(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float64)


def pair_masks(rows: torch.Tensor, cols: torch.Tensor, layout: PairLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """Masks for global row ids ``rows`` (m,) × column ids ``cols`` (n,).

    Returns ``(allowed, same_image)``, both (m, n) bool: ``allowed`` excludes the diagonal and applies the
    repel mode; ``same_image`` marks positives (diagonal excluded), for telemetry.
    """
    not_self = rows[:, None] != cols[None, :]
    same = (rows[:, None] // layout.views == cols[None, :] // layout.views) & not_self
    if layout.mode == "all":
        allowed = not_self
    elif layout.mode == "negatives":
        allowed = ~same & not_self
    else:  # positives
        allowed = same
    return allowed, same


def dense_repulsion(
    x_rows: torch.Tensor, x_all: torch.Tensor, layout: PairLayout, alpha: float
) -> tuple[torch.Tensor, RepulsionStats]:
    """Reference backend: the full (m, M_g) similarity block, autograd through it.

    Shape:
        x_rows: (m, D) normalised, this process's rows.  x_all: (M_g, D) normalised, detached.
        Returns a scalar L_r (differentiable w.r.t. x_rows) and the stats.
    """
    m = x_rows.shape[0]
    rows = torch.arange(layout.offset, layout.offset + m, device=x_rows.device)
    cols = torch.arange(x_all.shape[0], device=x_rows.device)
    allowed, same = pair_masks(rows, cols, layout)
    sim = x_rows @ x_all.T  # (m, D) @ (D, M_g) -> (m, M_g)
    value = (torch.relu(sim - alpha) * allowed).sum()
    st = RepulsionStats.zeros(x_rows.device)
    with torch.no_grad():
        s = sim.detach()
        not_self = rows[:, None] != cols[None, :]
        active = (s > alpha) & not_self
        st.active_pos = _f64((active & same).sum())
        st.active_neg = _f64((active & ~same).sum())
        if s.numel():
            st.max_cos = torch.maximum(st.max_cos, _f64(s.masked_fill(~not_self, -2.0).max()))
    return value, st


@torch.no_grad()
def blockwise_rows(
    x_rows: torch.Tensor,
    row_ids: torch.Tensor,
    x_all: torch.Tensor,
    layout: PairLayout,
    alpha: float,
    tile: int,
    st: RepulsionStats,
    *,
    first_row: int | None = None,
    row_counts: torch.Tensor | None = None,
    remote: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact row part for arbitrary rows, one (tile × tile) block at a time.

    Shape:
        x_rows: (m, D), row_ids: (m,) their global indices, x_all: (M_g, D).
        Returns ``(value, Y)``: value is a float64 scalar, Y is (m, D) with Y_i = Σ_{j active, allowed} x_j.

    ``first_row``: when the rows are the contiguous global rows ``first_row, first_row + 1, ...``, pass it:
    blocks that cannot contain the diagonal or a same-image pair (most of them: images are contiguous rows)
    are then recognised from host integers and skip those masks. ``row_counts`` (m,), if given, receives
    each row's number of active pairs (self excluded, positives included, whatever the repel mode).
    ``remote=True``: the columns are another rank's rows (a rank owns whole images), so no pair is a self pair
    or a positive and the column ids are not needed: every block is treated as disjoint (the ``ring`` backend
    and the screened exchange, docs/design.md §2). Statistics are added into ``st``.
    """
    m, n, v = x_rows.shape[0], x_all.shape[0], layout.views
    dev = x_rows.device
    y = torch.zeros_like(x_rows)
    value = torch.zeros((), dtype=torch.float64, device=dev)
    col_ids = torch.arange(n, device=dev)
    pos = torch.zeros((), dtype=torch.float64, device=dev)
    act_total = torch.zeros((), dtype=torch.float64, device=dev)
    max_cos = st.max_cos
    for r0 in range(0, m, tile):
        r1 = min(r0 + tile, m)
        xr, rid = x_rows[r0:r1], row_ids[r0:r1]
        rimg = rid // v
        for c0 in range(0, n, tile):
            c1 = min(c0 + tile, n)
            xc, cid = x_all[c0:c1], col_ids[c0:c1]
            sim = xr @ xc.T  # (tile, D) @ (D, tile) -> (tile, tile)
            active = sim > alpha
            disjoint = (
                remote
                or first_row is not None
                and ((first_row + r1 - 1) // v < c0 // v or (c1 - 1) // v < (first_row + r0) // v)
            )
            if disjoint:  # no image in common: no self pair, no positive
                act_total += active.sum()
                max_cos = torch.maximum(max_cos, _f64(sim.max()))
                use = active if layout.mode != "positives" else None
            else:
                not_self = rid[:, None] != cid[None, :]
                same = rimg[:, None] == (cid // v)[None, :]
                active &= not_self
                act_same = active & same
                pos += act_same.sum()
                act_total += active.sum()
                max_cos = torch.maximum(max_cos, _f64(sim.masked_fill(~not_self, -2.0).max()))
                use = {"all": active, "positives": act_same, "negatives": active & ~act_same}[layout.mode]
            if row_counts is not None:
                row_counts[r0:r1] += active.sum(dim=1)
            if use is None:
                continue
            w = use.to(xc.dtype)
            # On the CPU elementwise passes cost as much as the matmul: touch only the rows with a pair.
            # On CUDA that row list would be a host read, so the whole block is processed.
            hit = None if sim.is_cuda else use.any(dim=1).nonzero().squeeze(1)
            if hit is None or hit.numel() == r1 - r0:
                value += ((sim - alpha) * w).sum(dtype=torch.float64)
                y[r0:r1] += w @ xc  # (tile, tile) @ (tile, D): the gradient rows
            elif hit.numel():
                value += ((sim[hit] - alpha) * w[hit]).sum(dtype=torch.float64)
                y.index_add_(0, hit + r0, w[hit] @ xc)
    st.active_pos = st.active_pos + pos
    st.active_neg = st.active_neg + (act_total - pos)
    st.max_cos = max_cos
    return value, y


def own_block(
    x_rows: torch.Tensor, layout: PairLayout, alpha: float, tile: int, st: RepulsionStats
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`blockwise_rows` of this rank's rows against themselves (value, Y), for the backends that exchange
    the rows block by block (``ring``, the screened exchange). Images never straddle ranks and every rank's
    offset is a multiple of V, so local indices give the same pairs as global ones."""
    ids = torch.arange(x_rows.shape[0], device=x_rows.device)
    return blockwise_rows(x_rows, ids, x_rows, PairLayout(0, layout.views, layout.mode), alpha, tile, st, first_row=0)


def remote_block(
    x_rows: torch.Tensor, cols: torch.Tensor, layout: PairLayout, alpha: float, tile: int, st: RepulsionStats
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`blockwise_rows` of this rank's rows against rows of another rank (``cols``): no self pair, no
    positive (value, Y)."""
    ids = torch.arange(x_rows.shape[0], device=x_rows.device)
    return blockwise_rows(x_rows, ids, cols, layout, alpha, tile, st, remote=True)


class LinearizedRowSum(torch.autograd.Function):
    """Scalar ``value`` whose gradient w.r.t. ``x`` is the precomputed ``grad_rows`` (times grad_output).

    Used by the memory-bounded backends: they compute the repulsion value and its exact gradient rows in
    one pass without autograd (the hinge is piecewise linear in x_i), so backward has nothing to recompute.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, value: torch.Tensor, grad_rows: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(grad_rows)
        return value.to(x.dtype).clone()

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (grad_rows,) = ctx.saved_tensors
        return grad_out * grad_rows, None, None


def tiled_repulsion(
    x_rows: torch.Tensor,
    x_all: torch.Tensor,
    layout: PairLayout,
    alpha: float,
    tile: int = 4096,
    saturation_k: int | None = None,
) -> tuple[torch.Tensor, RepulsionStats]:
    """Exact backend with O(tile² + m·D) memory. Same contract as :func:`dense_repulsion`.

    ``saturation_k``: also count the rows with at least k active pairs, i.e. the rows a k-candidate search
    would call saturated (``auto`` compares the backends on this number while running ``tiled``).
    """
    st = RepulsionStats.zeros(x_rows.device)
    m, n = x_rows.shape[0], x_all.shape[0]
    row_ids = torch.arange(layout.offset, layout.offset + m, device=x_rows.device)
    counts = torch.zeros(m, dtype=torch.long, device=x_rows.device) if saturation_k is not None else None
    value, y = blockwise_rows(
        x_rows.detach(), row_ids, x_all, layout, alpha, tile, st, first_row=layout.offset, row_counts=counts
    )
    # A search of k + 1 candidates (the row itself included) over n >= k + 2 columns can miss neighbours.
    if counts is not None and saturation_k is not None and saturation_k + 1 < n:
        st.saturated_rows = _f64((counts >= saturation_k).sum())
    return LinearizedRowSum.apply(x_rows, value, y), st
