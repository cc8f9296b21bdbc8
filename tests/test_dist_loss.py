"""The global-batch contract (docs/design.md §3) with 2 real gloo processes, each holding a different slice.

Every rank must see the single-process loss of the concatenated batch, and its local gradient must be
exactly P × the single-process gradient of its rows, for every term and backend, in both regimes; under DDP
the averaged parameter gradients must equal the single-process ones.
"""

from __future__ import annotations

import os

import pytest
import torch
from _net import spawn_ranks
from loss_reference import make_feats

from hypersolid_scale.distributed import cleanup, init_distributed
from hypersolid_scale.losses import HypersolidLoss

WORLD = 2
CASES = [
    # (name, backend options, loss kwargs, regime, split of the B=8 images between the 2 ranks)
    ("dense-spread", {"backend": "dense"}, {}, "spread", (4, 4)),
    ("dense-collapsed", {"backend": "dense"}, {}, "collapsed", (4, 4)),
    ("tiled-spread", {"backend": "tiled", "tile_size": 7}, {}, "spread", (4, 4)),
    ("tiled-collapsed", {"backend": "tiled", "tile_size": 7}, {}, "collapsed", (4, 4)),
    ("neighbors-spread", {"backend": "neighbors", "k": 4}, {}, "spread", (4, 4)),
    ("neighbors-collapsed", {"backend": "neighbors", "k": 4}, {}, "collapsed", (4, 4)),
    ("uneven-tiled", {"backend": "tiled", "tile_size": 5}, {}, "collapsed", (3, 5)),
    ("negatives-mean", {"backend": "tiled", "tile_size": 6}, {"repel": "negatives", "pooling": "mean"}, "spread", (4, 4)),
    ("positives-neighbors", {"backend": "neighbors", "k": 3}, {"repel": "positives"}, "collapsed", (4, 4)),
    ("strong-norm", {"backend": "dense"}, {"norm_weight": 0.3, "alpha": 0.5}, "spread", (4, 4)),
    ("torch-search-spread", {"backend": "neighbors", "index": "torch", "k": 4, "tile_size": 5}, {}, "spread", (4, 4)),
    ("torch-search-collapsed", {"backend": "neighbors", "index": "torch", "k": 4}, {}, "collapsed", (4, 4)),
    ("same-size-gather", {"backend": "tiled", "tile_size": 7}, {"same_rows_per_rank": True}, "collapsed", (4, 4)),
    # auto, called twice: the second call's backend follows the first call's GLOBAL saturated fraction
    ("auto-twice-spread", {"backend": "auto", "k": 4, "tile_size": 5}, {}, "spread", (4, 4)),
    ("auto-twice-collapsed", {"backend": "auto", "k": 4}, {}, "collapsed", (3, 5)),
    # the side chosen by timing both at the first call: the slowest rank's times (the same side on both ranks)
    ("auto-twice-timed", {"backend": "auto", "k": 4, "auto": {"by": "time"}}, {}, "collapsed", (3, 5)),
]
B, V, D = 8, 3, 16



def loss_fn(case) -> HypersolidLoss:
    _, backend, kwargs, _, _ = case
    return HypersolidLoss(**backend, **kwargs)


def join_gloo_group(rank: int, world: int, port: int) -> None:
    """Join a ``world``-rank gloo group on 127.0.0.1:``port`` the way torchrun's workers do (its variables)."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    init_distributed("cpu", "gloo")


def _worker(rank: int, port: int, out_dir: str) -> None:
    join_gloo_group(rank, WORLD, port)
    results = {}
    for case in CASES:
        name, _, _, regime, split = case
        feats = make_feats(B, V, D, regime=regime, seed=1)
        start = sum(split[:rank])
        f = feats[start : start + split[rank]].clone().requires_grad_(True)
        fn = loss_fn(case)
        if name.startswith("auto-twice"):
            fn(f)
        loss = fn(f)
        loss.backward()
        results[name] = {"loss": loss.detach(), "grad": f.grad, "stats": fn.stats, "backend": fn.backend.state()}

    # DDP: a linear projector, each rank its own half of the inputs; the averaged gradient must be the
    # single-process gradient of the whole batch.
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(6, D).double())
    inputs = make_feats(B, V, 6, regime="collapsed", seed=2)
    part = inputs[rank * B // 2 : (rank + 1) * B // 2]
    out = HypersolidLoss(backend="tiled", tile_size=5, norm_weight=0.1)(model(part))
    out.backward()
    results["ddp"] = {"loss": out.detach(), "grads": [p.grad.clone() for p in model.parameters()]}
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    cleanup()


@pytest.fixture(scope="module")
def rank_results(tmp_path_factory):
    return spawn_ranks(_worker, WORLD, tmp_path_factory.mktemp("dist"))


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_two_ranks_reproduce_the_single_process_loss_and_gradients(rank_results, case):
    name, _, _, regime, split = case
    feats = make_feats(B, V, D, regime=regime, seed=1).requires_grad_(True)
    fn = loss_fn(case)
    if name.startswith("auto-twice"):
        fn(feats)
    loss = fn(feats)
    loss.backward()
    for rank in range(WORLD):
        got = rank_results[rank][name]
        start = sum(split[:rank])
        torch.testing.assert_close(got["loss"], loss.detach(), rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(got["grad"], WORLD * feats.grad[start : start + split[rank]], rtol=1e-10, atol=1e-14)
        measured = name == "auto-twice-timed"  # its side follows this machine's times, not the reference's
        for key in ("alignment", "repulsion", "normalization", "active_pairs", "active_pos", "max_cos",
                    *(() if measured else ("saturated_rows", "backend_neighbors")), "recall"):
            if key in fn.stats:
                assert got["stats"][key] == pytest.approx(fn.stats[key], rel=1e-10, abs=1e-14), key
    if regime == "collapsed":
        assert fn.stats["active_fraction"] > 0.5
    if name == "auto-twice-timed":
        states = [rank_results[rank][name]["backend"] for rank in range(WORLD)]
        assert states[0] == states[1] and states[0]["calls"] == 2 and set(states[0]["timed"]) == {"tiled", "neighbors"}
        sides = [rank_results[rank][name]["stats"]["backend_neighbors"] for rank in range(WORLD)]
        assert sides[0] == sides[1] == float(states[0]["current"] == "neighbors")
    elif name.startswith("auto-twice"):  # each regime lands on its side of the switch
        assert fn.stats["backend_neighbors"] == (1.0 if regime == "spread" else 0.0)
    assert feats.grad.abs().sum() > 0


@pytest.mark.slow
def test_ddp_averaging_yields_the_single_process_gradient(rank_results):
    torch.manual_seed(0)
    model = torch.nn.Linear(6, D).double()
    inputs = make_feats(B, V, 6, regime="collapsed", seed=2)
    out = HypersolidLoss(backend="tiled", tile_size=5, norm_weight=0.1)(model(inputs))
    out.backward()
    for rank in range(WORLD):
        got = rank_results[rank]["ddp"]
        torch.testing.assert_close(got["loss"], out.detach(), rtol=1e-12, atol=1e-14)
        for g, p in zip(got["grads"], model.parameters()):
            torch.testing.assert_close(g, p.grad, rtol=1e-10, atol=1e-13)
