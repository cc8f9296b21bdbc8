"""neighbors on the CPU recomputes only the candidate chunks that can change a result, with the results of
recomputing them all, bit for bit (loss value, gradient rows and every statistic)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hypersolid_scale.losses.neighbor_search import NeighborRepulsion
from hypersolid_scale.losses.repulsion import PairLayout


def _embeddings(b: int, v: int, d: int, image_noise: float, view_noise: float, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    classes = torch.randn(10, d, generator=g)
    images = classes[torch.randint(0, 10, (b,), generator=g)] + image_noise * torch.randn(b, d, generator=g)
    x = images[:, None] + view_noise * torch.randn(b, v, d, generator=g)
    return F.normalize(x.reshape(b * v, d), dim=1)


def _run(x_rows, x_all, layout, every_chunk: bool, monkeypatch, **opts):
    if every_chunk:
        monkeypatch.setattr(NeighborRepulsion, "_chunk_starts",
                            staticmethod(lambda xr, xa, s, n, a, chunk: range(0, xr.shape[0], chunk)))
    else:
        monkeypatch.undo()
    rows = x_rows.clone().requires_grad_(True)
    value, st = NeighborRepulsion(recall_every=1, **opts)(rows, x_all, layout, 0.9)
    value.backward()
    return value.detach(), rows.grad, {k: getattr(st, k) for k in st.__dataclass_fields__}


# spread (no negative near alpha), some negatives near, most rows near, collapsed (every row saturated)
@pytest.mark.parametrize("noise", [(3.0, 0.25), (0.35, 0.25), (0.06, 0.04), (0.0, 0.001)])
@pytest.mark.parametrize("mode", ["all", "negatives", "positives"])
@pytest.mark.parametrize("index,second_rank", [("flat", False), ("hnsw", True)])
def test_skipping_chunks_changes_nothing(noise, mode, index, second_rank, monkeypatch) -> None:
    b, v, d = 48, 8, 32
    x = _embeddings(b, v, d, *noise)
    offset = (b // 2) * v if second_rank else 0
    rows, layout = x[offset:], PairLayout(offset, v, mode)
    opts = {"index": index, "k": 12, "tile_size": 64}  # chunks of 64 * 64 // (13 * 32) = 9 rows
    full = _run(rows, x, layout, True, monkeypatch, **opts)
    skip = _run(rows, x, layout, False, monkeypatch, **opts)
    assert torch.equal(full[0], skip[0]) and torch.equal(full[1], skip[1])
    for name, val in full[2].items():
        assert torch.equal(val, skip[2][name]), name


def test_spread_regime_skips_the_candidate_recomputation() -> None:
    x = _embeddings(64, 8, 32, 3.0, 0.25)  # images far apart (cosine < 0.6), views close
    nb = NeighborRepulsion(index="flat", k=12, tile_size=64)
    scores, ids = nb.search(x, x)
    rows = torch.arange(x.shape[0])
    neg = (ids >= 0) & (ids // 8 != (rows // 8)[:, None])
    assert float(scores.masked_fill(~neg, -2).max()) < 0.9 - 1e-3  # no negative candidate near alpha
    starts = nb._chunk_starts(x, x, scores, neg, 0.9, 9)
    assert 1 <= len(starts) <= 2 < len(range(0, x.shape[0], 9))  # only the chunk(s) holding max_cos


def test_non_finite_input_takes_every_chunk() -> None:
    x = _embeddings(16, 8, 32, 0.35, 0.25)
    nb = NeighborRepulsion(index="flat", k=12, tile_size=64)
    scores, ids = nb.search(x, x)
    neg = ids >= 0
    bad = x.clone()
    bad[3, 0] = float("nan")
    assert list(nb._chunk_starts(x, bad, scores, neg, 0.9, 9)) == list(range(0, x.shape[0], 9))
