"""Repulsion backends: the row part of the short-range repulsion, over local rows × global columns.

Every backend computes, for the rows this process owns (``x_rows``, L2-normalised, differentiable) against
the detached columns of the global batch (``x_all``),

    L_r = Σ_{i ∈ rows} Σ_{j ≠ i, pair allowed} ReLU(x_i · x_j − α)

and returns it as a differentiable scalar whose gradient w.r.t. ``x_rows`` is the *row part* only (the
columns are constants). :class:`~hypersolid_scale.losses.HypersolidLoss` doubles it, because the similarity
matrix is symmetric (DESIGN §3).

* ``dense``: materialises the (m, M_g) similarity matrix and lets autograd do the rest. It is the
  paper-parity reference and the easiest code to trust; its memory is O(m · M_g).
* ``tiled``: walks (tile × tile) blocks without autograd and accumulates, next to the value, the gradient
  rows ``Y_i = Σ_{j active} x_j`` (ReLU is piecewise linear, so ∂L_r/∂x_i is exactly Y_i). A tiny custom
  ``autograd.Function`` hands Y back in backward, so backward costs nothing extra and no block is kept
  alive: peak memory is one block plus Y (the size of the embeddings), never an (M × M) matrix.

Thresholds are always decided in float32 or better (DESIGN §2): callers upcast bf16/fp16 input.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hypersolid_scale.losses.config import REPEL_MODES


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
    """Telemetry of one call, for this process's rows (ordered pairs; summed across ranks by the caller)."""

    active_pos: float = 0.0  # same-image pairs with cosine > alpha
    active_neg: float = 0.0  # different-image pairs with cosine > alpha
    max_cos: float = -1.0  # largest off-diagonal cosine seen
    candidates: float = 0.0  # neighbors: pairs whose similarity was computed
    saturated_rows: float = 0.0  # neighbors: rows whose k-th candidate was still above alpha
    recall: float | None = None  # neighbors: recall of active pairs against exact search, when measured


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


def _block_stats(sim: torch.Tensor, not_self: torch.Tensor, same: torch.Tensor, alpha: float, st: RepulsionStats):
    active = (sim > alpha) & not_self
    st.active_pos += float((active & same).sum())
    st.active_neg += float((active & ~same).sum())
    off = sim.masked_fill(~not_self, -2.0)
    if off.numel():
        st.max_cos = max(st.max_cos, float(off.max()))


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
    st = RepulsionStats()
    with torch.no_grad():
        _block_stats(sim.detach(), rows[:, None] != cols[None, :], same, alpha, st)
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact row part for arbitrary rows, one (tile × tile) block at a time.

    Shape:
        x_rows: (m, D), row_ids: (m,) their global indices, x_all: (M_g, D).
        Returns ``(value, Y)``: value is a float64 scalar, Y is (m, D) with Y_i = Σ_{j active, allowed} x_j.

    Elementwise passes over a block cost about as much as its matmul on a CPU, so blocks that cannot
    contain the diagonal or a same-image pair (most of them: images are contiguous rows) skip those masks.
    """
    m, n, v = x_rows.shape[0], x_all.shape[0], layout.views
    y = torch.zeros_like(x_rows)
    value = torch.zeros((), dtype=torch.float64, device=x_rows.device)
    col_ids = torch.arange(n, device=x_rows.device)
    pos = neg = 0.0
    for r0 in range(0, m, tile):
        xr, rid = x_rows[r0 : r0 + tile], row_ids[r0 : r0 + tile]
        rimg = rid // v
        r_lo, r_hi = int(rimg.min()), int(rimg.max())
        for c0 in range(0, n, tile):
            xc, cid = x_all[c0 : c0 + tile], col_ids[c0 : c0 + tile]
            sim = xr @ xc.T  # (tile, D) @ (D, tile) -> (tile, tile)
            active = sim > alpha
            c_lo, c_hi = int(cid[0]) // v, int(cid[-1]) // v
            if r_hi < c_lo or c_hi < r_lo:  # no image in common: no self pair, no positive
                n_act = float(active.sum())
                neg += n_act
                st.max_cos = max(st.max_cos, float(sim.max()))
                use = active if layout.mode != "positives" else None
            else:
                not_self = rid[:, None] != cid[None, :]
                same = rimg[:, None] == (cid // v)[None, :]
                active &= not_self
                act_same = active & same
                n_pos, n_act = float(act_same.sum()), float(active.sum())
                pos, neg = pos + n_pos, neg + n_act - n_pos
                off = sim.masked_fill(~not_self, -2.0)
                st.max_cos = max(st.max_cos, float(off.max()))
                use = {"all": active, "positives": act_same, "negatives": active & ~act_same}[layout.mode]
            if use is None or n_act == 0:
                continue
            w = use.to(xc.dtype)
            value += ((sim - alpha) * w).sum(dtype=torch.float64)
            y[r0 : r0 + tile] += w @ xc  # (tile, tile) @ (tile, D): the gradient rows
    st.active_pos += pos
    st.active_neg += neg
    return value, y


class LinearizedRowSum(torch.autograd.Function):
    """Scalar ``value`` whose gradient w.r.t. ``x`` is the precomputed ``grad_rows`` (times grad_output).

    Used by the memory-bounded backends: they compute the repulsion value and its exact gradient rows in
    one pass without autograd (the hinge is piecewise linear in x_i), so backward has nothing to recompute.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, value: torch.Tensor, grad_rows: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(grad_rows)
        return value.to(x.dtype).clone()

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (grad_rows,) = ctx.saved_tensors
        return grad_out * grad_rows, None, None


def tiled_repulsion(
    x_rows: torch.Tensor, x_all: torch.Tensor, layout: PairLayout, alpha: float, tile: int = 4096
) -> tuple[torch.Tensor, RepulsionStats]:
    """Exact backend with O(tile² + m·D) memory. Same contract as :func:`dense_repulsion`."""
    st = RepulsionStats()
    m = x_rows.shape[0]
    row_ids = torch.arange(layout.offset, layout.offset + m, device=x_rows.device)
    value, y = blockwise_rows(x_rows.detach(), row_ids, x_all, layout, alpha, tile, st)
    return LinearizedRowSum.apply(x_rows, value, y), st
