"""``backend=ring`` and ``screen=bf16`` on P = 2, 3, 4, 8 real gloo ranks: equal to single-process ``tiled``.

One spawn of 8 processes serves every P: ranks below P join a P-rank group (a port of its own), run every case,
and leave it. Each rank holds a different, uneven slice of a fixed float64 batch; on every rank the loss must be
the single-process ``tiled`` loss of the concatenated batch, the gradient P x its rows of the single-process
gradient (docs/design.md §3), and every statistic the same. The rows must never be all-gathered by ``ring``
(only 1-D vectors: the row counts and the packed statistics), and with ``screen=bf16`` the bytes a rank sends
must halve on spread embeddings. ``placed`` puts cross-rank pairs at α ± the screening bound δ and just above
and below α: a screen that dropped one pair it cannot decide (a threshold of α, or α − δ/2) changes the loss.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch
from _net import free_port, spawn
from loss_reference import make_feats
from test_dist_loss import join_gloo_group

from hypersolid_scale.distributed import cleanup
from hypersolid_scale.losses import HypersolidLoss
from hypersolid_scale.losses.screening import screening_bound

pytestmark = pytest.mark.slow

WORLDS = (2, 3, 4, 8)
V, D, ALPHA = 3, 32, 0.9
CASES = {  # name: loss options (float64 features; tile_size 4 splits every rank's rows into several tiles)
    "ring": {"backend": "ring", "tile_size": 4},
    "ring-bf16": {"backend": "ring", "tile_size": 4, "screen": "bf16"},
    "tiled-bf16": {"backend": "tiled", "tile_size": 4, "screen": "bf16"},
    "ring-negatives": {"backend": "ring", "tile_size": 5, "repel": "negatives", "alpha": 0.5},
}
REGIMES = ("spread", "collapsed", "placed")
OFFSETS = (1.0, 0.5, 1e-9, -1e-9, -0.5, -1.0, -2.0)  # placed pairs at α + t·δ: active for t > 0
STATS = ("loss", "alignment", "repulsion", "normalization", "active_pairs", "active_pos", "active_neg", "max_cos")


def split(world: int) -> list[int]:
    """Images per rank: uneven (1, 2, 3, 1, ...), except world 2 (3, 3), where ``same_rows_per_rank`` also runs."""
    return [3, 3] if world == 2 else [1 + r % 3 for r in range(world)]


def placed_feats(images: list[int]) -> torch.Tensor:
    """Spread images, and views of other ranks' images placed at cosine α + t·δ(D) from views of rank 0's first."""
    feats = make_feats(sum(images), V, D, regime="spread", seed=3)
    x = feats / feats.norm(dim=-1, keepdim=True)
    delta = screening_bound(D, torch.float64)
    g = torch.Generator().manual_seed(4)
    slots = [(img, v) for img in range(images[0], sum(images)) for v in range(V)]  # rows of ranks 1, 2, ...
    for n, t in enumerate(OFFSETS):
        anchor = x[0, n % V]
        z = torch.randn(D, generator=g, dtype=torch.float64)
        z = z - (z @ anchor) * anchor
        c = ALPHA + t * delta
        feats[slots[n]] = c * anchor + math.sqrt(1 - c * c) * z / z.norm()
    return feats


def batch(regime: str, world: int) -> torch.Tensor:
    images = split(world)
    if regime == "placed":
        return placed_feats(images)
    return make_feats(sum(images), V, D, regime=regime, seed=world)


def _worker(rank: int, ports: list[int], out_dir: str) -> None:
    import torch.distributed as dist

    gathered, sent = [], [0]
    all_gather, batch_send = dist.all_gather, dist.batch_isend_irecv

    def spy_gather(parts, tensor, *a, **k):
        gathered.append((tensor.dim(), tensor.dtype))
        return all_gather(parts, tensor, *a, **k)

    def spy_send(ops):
        sent[0] += sum(op.tensor.nbytes for op in ops if op.op is dist.isend)
        return batch_send(ops)

    dist.all_gather, dist.batch_isend_irecv = spy_gather, spy_send
    results = {}
    for world, port in zip(WORLDS, ports):
        if rank >= world:
            continue
        join_gloo_group(rank, world, port)
        images = split(world)
        start, rows = sum(images[:rank]), images[rank]
        for regime in REGIMES:
            feats = batch(regime, world)
            for name, opts in CASES.items():
                for same in (False, True) if world == 2 and name == "ring" else (False,):
                    f = feats[start : start + rows].clone().requires_grad_(True)
                    fn = HypersolidLoss(**opts, same_rows_per_rank=same)
                    gathered.clear()
                    sent[0] = 0
                    loss = fn(f)
                    loss.backward()
                    results[(world, regime, name, same)] = {
                        "loss": loss.detach(), "grad": f.grad, "stats": fn.stats, "gathered": list(gathered),
                        "sent": sent[0],
                    }
        cleanup()
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("ring")
    spawn(_worker, [free_port() for _ in WORLDS], str(out), nprocs=max(WORLDS))
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(max(WORLDS))]


def reference(regime: str, world: int, opts: dict) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Single-process ``tiled`` on the concatenated batch (same alpha, repel mode and tile)."""
    feats = batch(regime, world).requires_grad_(True)
    plain = {k: v for k, v in opts.items() if k not in ("backend", "screen")}
    fn = HypersolidLoss(backend="tiled", **plain)
    loss = fn(feats)
    loss.backward()
    return loss.detach(), feats.grad, fn.stats


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("regime", REGIMES)
def test_every_rank_gets_tiled_single_process_loss_gradients_and_stats(ranks, world, regime):
    images = split(world)
    for name, opts in CASES.items():
        loss, grad, stats = reference(regime, world, opts)
        if regime == "collapsed" and name != "ring-negatives":
            assert stats["active_fraction"] > 0.5
        if regime == "placed" and name != "ring-negatives":
            assert stats["active_neg"] >= 6  # the placed pairs at α + t·δ, t > 0, both orders (t = 0: not active)
        for rank in range(world):
            for key, got in ranks[rank].items():
                if key[:3] != (world, regime, name):
                    continue
                start, rows = sum(images[:rank]), images[rank]
                torch.testing.assert_close(got["loss"], loss, rtol=1e-12, atol=1e-14)
                torch.testing.assert_close(got["grad"], world * grad[start : start + rows], rtol=1e-10, atol=1e-13)
                for stat in STATS:
                    assert got["stats"][stat] == pytest.approx(stats[stat], rel=1e-12, abs=1e-14), (key, stat)
                if name.startswith("ring"):  # no row is all-gathered: only the counts and the statistics
                    assert all(dim == 1 for dim, _ in got["gathered"]), (key, got["gathered"])
                if name == "tiled-bf16":  # the rows are gathered in bf16 first
                    assert (2, torch.bfloat16) in got["gathered"], got["gathered"]


@pytest.mark.parametrize("world", WORLDS)
def test_bf16_columns_halve_the_bytes_sent_once_the_embeddings_spread(ranks, world):
    for rank in range(world):
        fp32, bf16 = (ranks[rank][(world, "spread", name, False)] for name in ("ring", "ring-bf16"))
        assert fp32["sent"] > 0 and bf16["sent"] <= 0.55 * fp32["sent"], (rank, fp32["sent"], bf16["sent"])
        assert bf16["stats"]["exact_fraction"] < 0.1
        collapsed = ranks[rank][(world, "collapsed", "ring-bf16", False)]
        assert collapsed["stats"]["exact_fraction"] == 1.0  # near collapse every row is needed exactly
        # the placed pairs are sent again: the screen let none of them through undecided
        assert ranks[rank][(world, "placed", "ring-bf16", False)]["stats"]["exact_fraction"] > 0


def test_ring_with_bf16_columns_trains_through_launch_train_on_two_processes_and_resumes(tmp_path):
    """``method.hypersolid.backend=ring`` (with ``screen=bf16``) under torchrun: 2 steps, a checkpoint, and a resume
    that continues from it to step 4 (that a resume is bit-exact is tests/test_train.py's)."""
    from _warm_python import run_processes

    from hypersolid_scale import checkpoint as ck

    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(repo)}
    args = [
        str(repo / "launch" / "train.py"), "--config", str(repo / "configs" / "quickstart.yaml"),
        "method.hypersolid.backend=ring", "method.hypersolid.screen=bf16", "method.hypersolid.tile_size=64",
        "method.hypersolid.out_dim=64", "method.hypersolid.hidden_dim=64", "data.num_local_views=2",
        "data.global_batch_size=32", "data.max_pretrain_samples=256", "data.num_workers=0", "optim.name=sgd",
        "optim.lr=0.05", "eval.every_n_epochs=0", "tracking.enabled=false", "checkpoint.every_n_steps=2",
        "checkpoint.keep_last=0", "deterministic=true", "progress=false", "dist.device=cpu",
    ]

    def train(run: Path, steps: int) -> str:
        proc = run_processes([*args, f"run_dir={run}", f"max_steps={steps}"], nproc=2, env=env, timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
        return proc.stdout + proc.stderr

    train(tmp_path / "run", 2)
    out = train(tmp_path / "run", 4)
    assert f"resumed from {ck.checkpoint_path(tmp_path / 'run', 2)} at step 2" in out
    state = ck.load_checkpoint(ck.list_checkpoints(tmp_path / "run")[-1])
    assert (state["step"], state["world_size"]) == (4, 2)
    assert all(torch.isfinite(v).all() for v in state["model"].values() if v.is_floating_point())
