"""``method.hypersolid.screen=bf16``: the columns cross ranks and are screened in bfloat16; the decisions stay exact.

Once training has started almost every pair sits far below α, and a pair's bf16 similarity ŝ is within a proven
bound δ(D) of the similarity s̃ the full-precision path computes (:func:`screening_bound`, derived in
docs/design.md §2, "Screening in bf16"). So a column that no row of this rank meets with ŝ ≥ min(α, c) − δ,
c the largest cosine this rank has found among its own rows, has no active pair here and cannot hold this rank's
largest cosine: it changes neither the value, nor the gradient, nor any statistic, and is never needed in full
precision. The other columns are *needed*: their owners send them again, in the input's precision, and every
pair with them is computed exactly, as ``tiled`` computes it.

Per call, with this rank's rows x (m × D) and every rank's ``counts``:

1. this rank's rows against themselves, exactly (:func:`~hypersolid_scale.losses.repulsion.own_block`): they
   never travel, and this gives c;
2. every other rank's rows in bf16 (half the bytes of fp32): by a ring pass (``ring``) or one all_gather
   (``tiled``), each screened against x in bf16 on arrival;
3. one max all-reduce of the needed-column mask (M_g bytes): the union over ranks, identical everywhere;
4. the needed rows of every rank, in full precision, by the same route, and their pairs computed exactly.

Near collapse every column is needed, and step 4 sends everything again (1.5× the bytes of fp32); once the
embeddings spread few are (≈ 0.5×). The statistic ``exact_fraction`` is the fraction of the global rows sent
again. Host reads: the mask's size per rank (step 4's sizes), a synchronisation on CUDA.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping

import torch

from hypersolid_scale.distributed import all_gather_detached, all_reduce_max, get_rank, ring_pass, row_counts
from hypersolid_scale.losses.repulsion import (
    LinearizedRowSum,
    PairLayout,
    RepulsionStats,
    own_block,
    remote_block,
)

BF16_UNIT = 2.0**-8  # unit roundoff of bfloat16: 8 significant bits, round to nearest even
FP32_UNIT = 2.0**-24
SCREEN_STATS = ("exact_fraction",)


def _gamma(n: int, unit: float) -> float:
    """γ_n = n·u / (1 − n·u): the relative error bound of a sum of n + 1 terms in any order (Higham, Thm. 3.1)."""
    return n * unit / (1.0 - n * unit)


def screening_bound(dim: int, dtype: torch.dtype) -> float:
    """δ(D): |ŝ − s̃| ≤ δ for any two rows of the loss (unit vectors of width ``dim`` normalised in ``dtype``).

    ŝ: both vectors rounded to bf16, products summed in fp32 (exact products: 8 + 8 significant bits);
    s̃: their dot product computed in ``dtype`` (what ``tiled`` compares with α). Derivation: docs/design.md §2.
    """
    u_in = torch.finfo(dtype).eps / 2
    wider = u_in < FP32_UNIT  # a wider input may be rounded to fp32 first: (1 + 2^-24)(1 + 2^-8) − 1
    rho = BF16_UNIT + (FP32_UNIT + FP32_UNIT * BF16_UNIT if wider else 0.0)
    eta = (dim + 2) * u_in  # ‖x‖ ≤ 1 + η after the normalisation in dtype
    norms = (1.0 + eta) ** 2  # Σ_k |a_k b_k| ≤ ‖a‖·‖b‖
    rounding = 2 * rho + rho * rho  # |â_k b̂_k − a_k b_k| ≤ (2ρ + ρ²)|a_k b_k|
    accumulate = _gamma(dim, FP32_UNIT) * (1.0 + rho) ** 2  # the fp32 sum of the exact bf16 products
    reference = _gamma(dim, u_in)  # s̃ itself is a rounded sum
    underflow = dim * 2.0**-133  # components below bf16's normal range round absolutely (2^-134 each, twice)
    return norms * (rounding + accumulate + reference) + underflow


def screened_similarity(rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """ŝ (m, n) float32 of bf16 rows (m, D) and columns (n, D): the products of the bf16 values are exact in fp32
    (and in TF32, so a GPU's TF32 matmul computes the same ŝ), summed in fp32."""
    return rows.float() @ cols.float().T  # (m, D) @ (D, n) -> (m, n)


@torch.no_grad()
def screen_columns(rows: torch.Tensor, cols: torch.Tensor, threshold: torch.Tensor, tile: int) -> torch.Tensor:
    """Columns (n,) bool that some row meets with ŝ ≥ ``threshold`` (a 0-dim float32 tensor), tile by tile.

    Shape: rows (m, D) and cols (n, D) in bfloat16.
    """
    need = torch.zeros(cols.shape[0], dtype=torch.bool, device=cols.device)
    for c0 in range(0, cols.shape[0], tile):
        for r0 in range(0, rows.shape[0], tile):
            s_hat = screened_similarity(rows[r0 : r0 + tile], cols[c0 : c0 + tile])  # (tile, tile)
            need[c0 : c0 + tile] |= (s_hat >= threshold).any(dim=0)
    return need


def screen_threshold(max_cos: torch.Tensor, alpha: float, bound: float) -> torch.Tensor:
    """min(α, c) − δ as float32, rounded down (a comparison in fp32 must not lose the margin)."""
    t = torch.clamp(max_cos, max=alpha) - bound  # float64
    t32 = t.float()
    return torch.where(t32.double() > t, torch.nextafter(t32, torch.full_like(t32, -math.inf)), t32)


def screened_exchange(
    x_rows: torch.Tensor, views: int, repel: str, alpha: float, tile: int, *, route: str, same_size: bool
) -> tuple[torch.Tensor, RepulsionStats, int]:
    """:meth:`Backend.exchange <hypersolid_scale.losses.backends.Backend.exchange>` with ``screen=bf16``: the row
    part L_r (its gradient the exact rows Y, ``LinearizedRowSum``), its statistics and M_g.

    ``route``: how rows cross ranks, "ring" (:func:`~hypersolid_scale.distributed.ring_pass`) or "gather" (one
    all_gather); ``same_size``: every rank holds as many rows (no row-count exchange).
    """
    xr = x_rows.detach()
    counts = row_counts(xr.shape[0], xr.device, same_size=same_size)
    layout, st = PairLayout(sum(counts[: get_rank()]), views, repel), RepulsionStats.zeros(xr.device)
    value, y = _screened_rows(xr, layout, alpha, tile, st, counts, route=route, same_size=same_size)
    return LinearizedRowSum.apply(x_rows, value, y), st, sum(counts)


@torch.no_grad()
def _screened_rows(
    x_rows: torch.Tensor,
    layout: PairLayout,
    alpha: float,
    tile: int,
    st: RepulsionStats,
    counts: list[int],
    *,
    route: str,
    same_size: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(value, Y) of this rank's rows against every rank's, screened in bf16 (steps 1-4 above). Adds into ``st``
    (``exact_rows``: this rank's rows sent again)."""
    rank, m, dev = get_rank(), x_rows.shape[0], x_rows.device
    if len(counts) == 1:  # one process: no other rank's rows to screen, nothing read on the host
        return own_block(x_rows, layout, alpha, tile, st)
    offset, total = sum(counts[:rank]), sum(counts)
    bound = screening_bound(x_rows.shape[1], x_rows.dtype)
    low = x_rows.to(torch.bfloat16)
    need = torch.zeros(total, dtype=torch.uint8, device=dev)
    if route == "ring":  # steps 1 and 2: the own block first, while the first bf16 block is in flight
        starts = [sum(counts[:s]) for s in range(len(counts))]
        for src, block in ring_pass(low, counts):
            if src == rank:
                value, y = own_block(x_rows, layout, alpha, tile, st)  # st.max_cos is now this rank's c
                threshold = screen_threshold(st.max_cos, alpha, bound)
            else:
                need[starts[src] : starts[src] + counts[src]] = screen_columns(low, block, threshold, tile)
    else:
        low_all, _ = all_gather_detached(low, same_size=same_size)
        value, y = own_block(x_rows, layout, alpha, tile, st)
        need = screen_columns(low, low_all, screen_threshold(st.max_cos, alpha, bound), tile).to(torch.uint8)
        need[offset : offset + m] = 0  # this rank's own columns were computed exactly in step 1
    need = all_reduce_max(need)  # step 3: the union over ranks, identical on every rank
    sizes = [int(n) for n in torch.stack([p.sum() for p in need.split(counts)]).tolist()]  # host read
    st.exact_rows = st.exact_rows + sizes[rank]
    if sum(sizes) == 0:
        return value, y
    mine = x_rows[need[offset : offset + m].bool()]  # step 4: the needed rows, in full precision
    blocks: Iterator[torch.Tensor]
    if route == "ring":
        blocks = (block for src, block in ring_pass(mine, sizes) if src != rank and block.shape[0])
    else:
        got, got_at = all_gather_detached(mine, same_size=False)
        blocks = iter([torch.cat([got[:got_at], got[got_at + mine.shape[0] :]])])
    for block in blocks:
        v_b, y_b = remote_block(x_rows, block, layout, alpha, tile, st)
        value += v_b
        y += y_b
    return value, y


def screen_stats(sums: Mapping[str, torch.Tensor], rows: int) -> dict[str, torch.Tensor]:
    """The values of :data:`SCREEN_STATS`: the fraction of the global rows sent again in full precision."""
    return {"exact_fraction": sums["exact_rows"] / rows}
