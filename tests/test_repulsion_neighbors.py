"""The ``neighbors`` backend: exactness of ``flat`` and of the torch search, recall and bounded error of
``ivf``/``hnsw``, the IVF quantizer kept between calls; the torch blockwise top-k against a dense top-k; the CUDA
paths (skipped without CUDA)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from loss_reference import make_feats

from hypersolid_scale.losses import HypersolidLoss, topk_inner_product
from hypersolid_scale.losses.candidates import ReusedIVF, faiss_gpu_available, faiss_search, ivf_lists
from hypersolid_scale.losses.neighbor_search import NeighborRepulsion

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def clustered_embeddings(n_images=600, views=4, d=64, n_classes=12, seed=0) -> torch.Tensor:
    """A trained-encoder-like distribution: classes, images around their class, views around their image.

    Tuned so that a few percent of rows have neighbours inside alpha = 0.9 (same image and same class),
    as after the first epochs of training.
    """
    g = torch.Generator().manual_seed(seed)
    classes = torch.randn(n_classes, d, generator=g)
    labels = torch.randint(0, n_classes, (n_images,), generator=g)
    images = classes[labels] + 0.35 * torch.randn(n_images, d, generator=g)
    return images[:, None, :] + 0.25 * torch.randn(n_images, views, d, generator=g)


def run(fn, feats):
    f = feats.clone().requires_grad_(True)
    loss = fn(f)
    loss.backward()
    return float(loss.detach()), f.grad, dict(fn.stats)


@pytest.fixture(scope="module")
def feats():
    return clustered_embeddings()


@pytest.fixture(scope="module")
def exact(feats):
    return run(HypersolidLoss(backend="dense"), feats)


def test_distribution_is_realistic(exact):
    stats = exact[2]
    assert stats["active_neg"] > 0 and stats["active_pos"] > 0
    assert 1e-4 < stats["active_fraction"] < 0.05


def test_flat_is_exact_and_reports_recall_one(feats, exact):
    loss, grad, stats = run(HypersolidLoss(backend="neighbors", index="flat", k=32, recall_every=1), feats)
    assert loss == pytest.approx(exact[0], rel=1e-6)
    torch.testing.assert_close(grad, exact[1], rtol=1e-4, atol=1e-7)
    assert stats["recall"] == 1.0
    assert stats["candidates"] > 0
    assert stats["active_pairs"] == exact[2]["active_pairs"]


def test_small_k_saturates_and_stays_exact(feats, exact):
    """k=2 cannot hold each row's active neighbours: those rows fall back to the exact path."""
    loss, grad, stats = run(HypersolidLoss(backend="neighbors", index="flat", k=2, recall_every=1), feats)
    assert stats["saturated_rows"] > 0
    assert loss == pytest.approx(exact[0], rel=1e-6)
    torch.testing.assert_close(grad, exact[1], rtol=1e-4, atol=1e-7)
    assert stats["recall"] == 1.0


@pytest.mark.parametrize("index,opts", [("ivf", {"nprobe": 8}), ("hnsw", {"ef_search": 64})])
def test_approximate_indexes_recall_floor_and_bounded_error(feats, exact, index, opts):
    loss, grad, stats = run(HypersolidLoss(backend="neighbors", index=index, k=64, recall_every=1, **opts), feats)
    assert stats["recall"] >= 0.9, stats
    exact_rep = exact[2]["repulsion"]
    assert abs(stats["repulsion"] - exact_rep) <= 0.1 * exact_rep
    assert abs(loss - exact[0]) <= 0.01 * exact[0]
    # the gradient is the exact one restricted to the found pairs: close in direction to the exact gradient
    cos = torch.nn.functional.cosine_similarity(grad.flatten(), exact[1].flatten(), dim=0)
    assert cos > 0.99


def test_recall_is_measured_every_n_calls(feats):
    fn = HypersolidLoss(backend="neighbors", k=8, recall_every=3)
    seen = []
    for _ in range(4):
        fn(feats[:50])
        seen.append("recall" in fn.stats)
    assert seen == [True, False, False, True]


def test_recall_measurement_sees_a_poor_index(feats):
    """nprobe=1 visits one inverted list: the measured recall must drop, and the loss falls short."""
    fn = HypersolidLoss(backend="neighbors", index="ivf", k=64, nprobe=1, recall_every=1)
    run(fn, feats)
    assert fn.stats["recall"] < 0.9


# ----------------------------------------------------------------------------------------- torch search
def _drifting(feats: torch.Tensor, steps: int) -> list[np.ndarray]:
    """The rows of ``feats`` at ``steps`` training steps: unit vectors moved a little further each step."""
    g = torch.Generator().manual_seed(1)
    x, noise = feats.flatten(0, 1), torch.randn(feats.flatten(0, 1).shape, generator=g)
    return [np.ascontiguousarray(F.normalize(x + 0.03 * i * noise, dim=-1).numpy()) for i in range(steps)]


def test_the_kept_ivf_quantizer_is_retrained_when_due_and_searches_as_a_fresh_index_otherwise(feats):
    """ivf_retrain_every=1 is the index trained at every call (the same sample, the same result); every 3 calls
    trains at calls 1 and 4 of 6; a kept quantizer with every list probed searches exhaustively: flat's result."""
    every_call, kept = ReusedIVF(1), ReusedIVF(3)
    for x in _drifting(feats, 6):
        want = faiss_search(x, x, 9, "ivf", nprobe=4)
        got = every_call.search(x, x, 9, nprobe=4)
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_array_equal(got[0], want[0])
        scores, _ = kept.search(x, x, 9, nprobe=ivf_lists(x.shape[0]))
        np.testing.assert_allclose(scores, faiss_search(x, x, 9, "flat")[0], rtol=0, atol=1e-5)
    assert (every_call.trainings, kept.trainings) == (6, 2)
    with pytest.raises(ValueError, match="retrain_every=0 must be >= 1"):
        ReusedIVF(0)


def test_a_kept_ivf_quantizer_with_every_list_probed_gives_the_dense_loss_and_gradient(feats, exact):
    """The quantizer trained on other rows (a drifted batch), kept for the next call: with nprobe covering every
    list the search is exhaustive, so the loss and gradient are dense's, whatever the centroids."""
    fn = HypersolidLoss(backend="neighbors", index="ivf", k=64, nprobe=10**6, ivf_retrain_every=100, recall_every=1)
    older = torch.from_numpy(_drifting(feats, 4)[3]).reshape(feats.shape)
    fn(older)
    loss, grad, stats = run(fn, feats)
    assert fn.backend.neighbors.ivf.trainings == 1  # type: ignore[attr-defined]
    assert loss == pytest.approx(exact[0], rel=1e-6)
    torch.testing.assert_close(grad, exact[1], rtol=1e-4, atol=1e-7)
    assert stats["recall"] == 1.0


@pytest.mark.parametrize("m,n,k,tile", [(37, 53, 5, 8), (10, 10, 10, 3), (64, 40, 1, 64), (5, 200, 17, 7)])
def test_topk_inner_product_equals_a_dense_topk(m, n, k, tile):
    g = torch.Generator().manual_seed(m * n)
    q, b = torch.randn(m, 12, generator=g, dtype=torch.float64), torch.randn(n, 12, generator=g, dtype=torch.float64)
    scores, ids = topk_inner_product(q, b, k, tile=tile)
    ref_scores, _ = (q @ b.T).topk(k, dim=1)
    assert scores.shape == ids.shape == (m, k) and ids.dtype == torch.long
    torch.testing.assert_close(scores, ref_scores, rtol=0, atol=1e-12)
    # ids name the columns that give those scores, each at most once per row
    torch.testing.assert_close((q[:, None, :] * b[ids]).sum(-1), scores, rtol=0, atol=1e-12)
    assert all(len(set(row)) == k for row in ids.tolist())


def test_topk_inner_product_rejects_bad_arguments():
    q, b = torch.randn(4, 3), torch.randn(6, 3)
    with pytest.raises(ValueError, match="k=7 must be between 1 and the number of base vectors"):
        topk_inner_product(q, b, 7)
    with pytest.raises(ValueError, match="share D"):
        topk_inner_product(q, torch.randn(6, 2), 2)


def test_search_routing():
    """flat on the CPU is FAISS; torch is the torch search anywhere; flat on CUDA is the torch search."""
    assert NeighborRepulsion(index="flat").where(torch.device("cpu")) == "faiss-cpu"
    assert NeighborRepulsion(index="torch").where(torch.device("cpu")) == "torch"
    assert NeighborRepulsion(index="flat").where(torch.device("cuda")) == "torch"
    assert NeighborRepulsion(index="hnsw").where(torch.device("cuda")) == "faiss-cpu"


@pytest.mark.parametrize("regime", ["spread", "collapsed"])
@pytest.mark.parametrize("k", [2, 6, 64])
def test_torch_search_is_exact_in_both_regimes(regime, k):
    """Loss and gradient of neighbors(index=torch) equal dense in float64, whether rows saturate or not."""
    feats = make_feats(40, 4, 16, regime=regime, seed=k)
    ref = run(HypersolidLoss(backend="dense"), feats)
    got = run(HypersolidLoss(backend="neighbors", index="torch", k=k, tile_size=24, recall_every=1), feats)
    assert got[0] == pytest.approx(ref[0], rel=1e-13)
    torch.testing.assert_close(got[1], ref[1], rtol=1e-10, atol=1e-14)
    assert got[2]["recall"] == 1.0 and got[2]["active_pairs"] == ref[2]["active_pairs"]
    assert got[2]["max_cos"] == pytest.approx(ref[2]["max_cos"], rel=1e-13)
    if regime == "collapsed" and k < 64:
        assert got[2]["saturated_rows"] > 0  # the exact fallback was exercised
    if regime == "spread":
        assert got[2]["saturated_rows"] < 160


def test_torch_search_matches_faiss_flat(feats, exact):
    loss_t, grad_t, stats_t = run(HypersolidLoss(backend="neighbors", index="torch", k=32, recall_every=1), feats)
    loss_f, grad_f, stats_f = run(HypersolidLoss(backend="neighbors", index="flat", k=32, recall_every=1), feats)
    assert loss_t == pytest.approx(exact[0], rel=1e-6) and loss_t == pytest.approx(loss_f, rel=1e-6)
    torch.testing.assert_close(grad_t, exact[1], rtol=1e-4, atol=1e-7)
    assert stats_t["saturated_rows"] == stats_f["saturated_rows"] and stats_t["recall"] == 1.0


# ----------------------------------------------------------------------------------------- CUDA
@cuda
@pytest.mark.cuda
def test_cuda_topk_matches_the_cpu():
    g = torch.Generator().manual_seed(0)
    q, b = F.normalize(torch.randn(300, 64, generator=g), dim=1), F.normalize(torch.randn(900, 64, generator=g), dim=1)
    s_cpu, _ = topk_inner_product(q, b, 33, tile=128)
    s_gpu, i_gpu = topk_inner_product(q.cuda(), b.cuda(), 33, tile=128)
    assert s_gpu.is_cuda and i_gpu.is_cuda
    torch.testing.assert_close(s_gpu.cpu(), s_cpu, rtol=1e-5, atol=1e-5)


@cuda
@pytest.mark.cuda
@pytest.mark.parametrize("regime", ["spread", "collapsed"])
@pytest.mark.parametrize("index", ["flat", "torch"])
def test_cuda_neighbors_search_on_the_device_is_exact(regime, index):
    """On CUDA, flat and torch search on the device; loss and gradient equal dense on the same device."""
    feats = make_feats(128, 4, 32, regime=regime, seed=1).cuda()
    fn = HypersolidLoss(backend="neighbors", index=index, k=8, tile_size=96, recall_every=1)
    assert fn.backend.neighbors.where(feats.device) == "torch"
    got = run(fn, feats)
    ref = run(HypersolidLoss(backend="dense"), feats)
    assert got[0] == pytest.approx(ref[0], rel=1e-12)
    torch.testing.assert_close(got[1], ref[1], rtol=1e-9, atol=1e-13)
    assert got[2]["recall"] == 1.0 and got[2]["active_pairs"] == ref[2]["active_pairs"]
    assert fn.packed_stats.values.is_cuda


@cuda
@pytest.mark.cuda
@pytest.mark.skipif(not faiss_gpu_available(), reason="needs faiss-gpu")
def test_cuda_faiss_gpu_ivf_recall_floor(feats, exact):
    fn = HypersolidLoss(backend="neighbors", index="ivf", k=64, nprobe=8, recall_every=1)
    assert fn.backend.neighbors.where(torch.device("cuda")) == "faiss-gpu"
    loss, grad, stats = run(fn, feats.cuda())
    assert stats["recall"] >= 0.9, stats
    assert abs(loss - exact[0]) <= 0.01 * exact[0]


def test_the_ivf_reuse_benchmark_measures_a_kept_and_a_fresh_quantizer_against_flat(feats):
    """benchmarks/ivf_reuse.py's measurement: the kept quantizer is the older rows' (trained once), both
    searches' recalls are against flat's top-k; with every list probed both find exactly flat's."""
    from benchmarks.ivf_reuse import measure

    older, newer = _drifting(feats, 6)[::5]
    lists = ivf_lists(newer.shape[0])
    row = measure(older, newer, 9, 4, 0.9, 1)
    assert row["lists"] == lists and row["fresh_s"] > 0 and row["reused_s"] > 0
    assert 0.5 < row["reused"]["topk_recall"] <= 1 and 0.5 < row["fresh"]["topk_recall"] <= 1
    every = measure(older, newer, 9, lists, 0.9, 1)
    assert every["fresh"]["topk_recall"] == every["reused"]["topk_recall"] == pytest.approx(1.0, abs=1e-3)
