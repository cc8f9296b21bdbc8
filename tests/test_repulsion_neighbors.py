"""The FAISS ``neighbors`` backend: exactness of ``flat``, recall and bounded error of ``ivf``/``hnsw``."""

from __future__ import annotations

import pytest
import torch

from hypersolid_scale.losses import HypersolidLoss


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
