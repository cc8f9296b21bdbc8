"""Every method with 2 real gloo processes, each holding half the batch, equals one process on the whole batch.

Losses that need the whole batch (SimCLR's negatives, VICReg's variance/covariance, Barlow Twins'
cross-correlation, SwaV's Sinkhorn, DINO's center) must gather it; each rank's gradient is then P x its share,
so the average over ranks (what DDP computes) must be the single-process gradient, and the mean of the ranks'
losses the single-process loss. BatchNorm is global on the ranks (the engine's conversion), as it must be.
"""

from __future__ import annotations

import os

import pytest
import torch
from _net import spawn_ranks
from test_methods import B, build, make_views

from hypersolid_scale.distributed import cleanup, convert_global_batchnorm, init_distributed
from hypersolid_scale.methods import method_names

pytestmark = pytest.mark.filterwarnings("ignore:.*weight_norm.*:FutureWarning")

METHODS = method_names()

WORLD = 2


def run_method(name: str, rank: int | None) -> dict[str, object]:
    """Loss, averaged-ready gradients and DINO's center for ``name``: rank ``rank``'s half of the batch, or the
    whole batch when ``rank`` is None."""
    backbone, method = build(name, queue_length=0) if name == "swav" else build(name)
    backbone, method = backbone.double(), method.double()
    if rank is not None:
        holder = convert_global_batchnorm(torch.nn.ModuleDict({"backbone": backbone, "method": method}))
        backbone, method = holder["backbone"], holder["method"]
    views = [v.double() for v in make_views(0)]
    if rank is not None:
        half = B // WORLD
        views = [v[rank * half : (rank + 1) * half] for v in views]
    loss, _ = method(views, backbone)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in [*backbone.named_parameters(), *method.named_parameters()]
             if p.grad is not None}
    center = method.criterion.center.clone() if name == "dino" else None
    return {"loss": loss.detach(), "grads": grads, "center": center}


def _worker(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    init_distributed("cpu", "gloo")
    torch.save({name: run_method(name, rank) for name in METHODS}, os.path.join(out_dir, f"rank{rank}.pt"))
    cleanup()


@pytest.fixture(scope="module")
def rank_results(tmp_path_factory):
    return spawn_ranks(_worker, WORLD, tmp_path_factory.mktemp("methods_dist"))


@pytest.mark.slow
@pytest.mark.parametrize("name", METHODS)
def test_two_ranks_average_to_the_single_process_loss_and_gradient(rank_results, name):
    single = run_method(name, None)
    ranks = [r[name] for r in rank_results]
    torch.testing.assert_close(sum(r["loss"] for r in ranks) / WORLD, single["loss"], rtol=1e-5, atol=1e-5)
    assert set(ranks[0]["grads"]) == set(single["grads"])
    for key, expected in single["grads"].items():
        averaged = sum(r["grads"][key] for r in ranks) / WORLD  # DDP's averaging
        torch.testing.assert_close(averaged, expected, rtol=1e-5, atol=1e-5, msg=key)
    assert sum(g.abs().sum() for g in single["grads"].values()) > 0
    if name == "dino":  # the center is the EMA of the teacher outputs' mean over the GLOBAL batch
        assert not torch.equal(single["center"], torch.zeros_like(single["center"]))
        for r in ranks:
            torch.testing.assert_close(r["center"], single["center"], rtol=1e-10, atol=1e-12)


def test_per_rank_standardised_barlow_twins_would_differ():
    """Why Barlow Twins gathers its projections: lightly's distributed variant averages cross-correlations
    standardised per rank, which is not the single-process loss of the whole batch."""
    from lightly.loss import BarlowTwinsLoss
    from lightly.loss.barlow_twins_loss import _normalize, _off_diagonal

    g = torch.Generator().manual_seed(0)
    za, zb = torch.randn(8, 4, generator=g, dtype=torch.float64), torch.randn(8, 4, generator=g, dtype=torch.float64)
    whole = BarlowTwinsLoss()(za, zb)
    c = sum(_normalize(za[i : i + 4]).T @ _normalize(zb[i : i + 4]) / 4 for i in (0, 4)) / 2
    per_rank = (torch.diagonal(c) - 1).pow(2).sum() + 0.005 * _off_diagonal(c).pow(2).sum()
    assert abs(float(per_rank) - float(whole)) > 1e-3
