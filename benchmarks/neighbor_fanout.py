"""How far a row's exclusion cap reaches among coarse cells: the fanout a sharded neighbour index would pay.

    python -m benchmarks.neighbor_fanout --checkpoints RUN/checkpoints/step_*.pt     # + the run's initial weights
    python -m benchmarks.neighbor_fanout --checkpoints A.pt B.pt --batches 8 --cells 64 256 1024

A sharded index (docs/design.md §2, neighbors) would split the global rows into C coarse cells (spherical
k-means), let each rank own C/P of them, and send each row only to the ranks whose cells its exclusion cap
{y : cos(x, y) > α} can reach. A cell c with centroid μ_c and angular radius θ_c (the largest angle from μ_c to a
member) can hold a neighbour of x only if angle(x, μ_c) < arccos α + θ_c: the centroid-plus-radius bound, exact.
The fanout of x is the number of such cells; its ranks, the distinct owners of those cells (cells dealt round
robin to P ranks). A row's bytes in such an index are proportional to its ranks, so the design only pays off when
the fanout is small against P.

Embeddings: the training loader's first ``--batches`` global batches (every view, the multi-crop batching of
training: one backbone call per resolution, BatchNorm on the batch's statistics), through each checkpoint's
backbone and projector, and through the run's initial weights (``random_init_checkpoint``: the near-collapsed
start). Writes runs/bench/neighbor_fanout.json (``--out`` elsewhere).
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks import common
from hypersolid_scale.safety import atomic

WORLDS = (8, 64, 512)


def embed_rows(ckpt: dict[str, Any], batches: list[list[torch.Tensor]]) -> torch.Tensor:
    """Unit rows (M, D): every view of ``batches`` through the checkpoint's backbone and projection head."""
    from hypersolid_scale.checkpoint.eval_model import build_model_from_checkpoint
    from hypersolid_scale.methods.base import encode

    model, _ = build_model_from_checkpoint(ckpt)
    if model.projector is None:
        raise SystemExit("the checkpoint's method has no projection head: no loss rows to measure")
    model.train()  # BatchNorm on each call's batch, as in training
    rows = []
    with torch.no_grad():
        for views in batches:
            feats = encode(model.backbone, views, separate=False)
            rows.append(torch.nn.functional.normalize(model.projector(torch.cat(feats)), dim=-1))
    return torch.cat(rows)


def training_batches(ckpt: dict[str, Any], n: int) -> tuple[list[list[torch.Tensor]], float]:
    """The first ``n`` global batches (every view) of the training loader of ``ckpt``'s run, epoch 0, and the
    run's α."""
    from hypersolid_scale.config.schema import from_dict
    from hypersolid_scale.distributed import WorldInfo
    from hypersolid_scale.training import trainer

    with tempfile.TemporaryDirectory() as tmp:
        cfg = from_dict({**ckpt["config"], "run_dir": tmp})
        cfg.tracking.enabled, cfg.data.num_workers = False, 0
        run = trainer.build(cfg, WorldInfo(0, 1, 0, "single"), torch.device("cpu"))
        run.loader.set_epoch(0)
        batches = []
        for views, _ in run.loader:
            batches.append([v.float() for v in views])
            if len(batches) == n:
                break
    return batches, float(cfg.method.section().alpha)


def spherical_kmeans(x: torch.Tensor, cells: int, iters: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(centroids (C, D) unit, assignment (M,)): Lloyd's iterations on the sphere from ``cells`` random rows."""
    g = torch.Generator().manual_seed(seed)
    mu = x[torch.randperm(x.shape[0], generator=g)[:cells]].clone()
    assign = torch.zeros(x.shape[0], dtype=torch.long)
    for _ in range(iters):
        assign = (x @ mu.T).argmax(dim=1)  # (M, D) @ (D, C)
        sums = torch.zeros_like(mu).index_add_(0, assign, x)
        filled = sums.norm(dim=1) > 0
        mu[filled] = torch.nn.functional.normalize(sums[filled], dim=1)  # an empty cell keeps its centroid
    return mu, assign


def fanout(
    x: torch.Tensor, mu: torch.Tensor, assign: torch.Tensor, alpha: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(reach (M, C) bool: the cells each row's cap {cos > α} can reach by the centroid-plus-radius bound;
    θ_c (C,) the cells' angular radii; the angle (M, C) from each row to each centroid), in radians."""
    angles = torch.acos((x @ mu.T).clamp(-1, 1))  # (M, D) @ (D, C)
    own = angles.gather(1, assign[:, None]).squeeze(1)
    radius = torch.zeros(mu.shape[0]).scatter_reduce(0, assign, own, "amax", include_self=False)  # θ_c
    reach = math.acos(alpha) + radius  # (C,): angle(x, μ_c) must be below this
    return angles < reach.clamp(max=math.pi)[None, :], radius, angles


def owners(reach: torch.Tensor, world: int) -> torch.Tensor:
    """(M,) distinct ranks among each row's reachable cells, cells dealt round robin to ``world`` ranks."""
    per_rank = torch.zeros(reach.shape[0], world, dtype=torch.bool)
    cells = torch.arange(reach.shape[1])
    for r in range(world):
        per_rank[:, r] = reach[:, cells % world == r].any(dim=1)
    return per_rank.sum(dim=1)


def summarize(values: torch.Tensor) -> dict[str, float]:
    v = values.double()
    return {
        "median": float(v.median()),
        "mean": float(v.mean()),
        "p90": float(v.quantile(0.9)),
        "max": float(v.max()),
    }


def measure(name: str, x: torch.Tensor, alpha: float, cells: list[int], iters: int) -> list[dict[str, Any]]:
    m = x.shape[0]
    sims = x @ x.T
    active = float(((sims > alpha).sum() - m) / (m * (m - 1)))
    del sims
    out = []
    for c in cells:
        mu, assign = spherical_kmeans(x, c, iters)
        reach, radius, angles = fanout(x, mu, assign, alpha)
        filled = torch.bincount(assign, minlength=c) > 0
        row = {
            "checkpoint": name,
            "rows": m,
            "alpha": alpha,
            "active_fraction": active,
            "cells": c,
            "fanout": summarize(reach.sum(dim=1)),
            "fanout_fraction_median": float(reach.sum(dim=1).double().median()) / c,
            # what the bound adds to the cap's half-angle arccos α, and how far the other cells' centroids are
            "cap_half_angle_deg": math.degrees(math.acos(alpha)),
            "cell_radius_deg": summarize(torch.rad2deg(radius[filled])),
            "angle_to_centroids_deg": summarize(torch.rad2deg(angles[:, filled]).flatten()[:: max(1, c // 16)]),
        }
        for world in WORLDS:
            if world <= c:
                row[f"ranks_P{world}"] = summarize(owners(reach, world))
        out.append(row)
        print(json.dumps(row), flush=True)
    return out


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--checkpoints", type=Path, nargs="+", required=True, help="checkpoints of one run")
    parser.add_argument("--batches", type=int, default=8, help="global batches of the training loader to embed")
    parser.add_argument("--cells", type=int, nargs="+", default=[64, 256, 1024], help="coarse cells C")
    parser.add_argument("--iters", type=int, default=10, help="k-means iterations")
    common.add_out(parser, "neighbor_fanout.json", what="the JSON file")
    args = parser.parse_args()

    from hypersolid_scale.checkpoint import load_checkpoint
    from hypersolid_scale.checkpoint.eval_model import random_init_checkpoint

    torch.manual_seed(0)
    first = load_checkpoint(args.checkpoints[0])
    batches, alpha = training_batches(first, args.batches)
    sources = [("init", random_init_checkpoint(first))]
    for path in args.checkpoints:
        ckpt = load_checkpoint(path)
        sources.append((f"step {ckpt['step']}", {**ckpt, "path": str(path)}))
    rows = []
    for name, ckpt in sources:
        rows += measure(name, embed_rows(ckpt, batches), alpha, args.cells, args.iters)
    meta = common.metadata(
        "cpu",
        run_config={k: first["config"][k] for k in ("data", "model") if k in first["config"]},
        batches=args.batches,
        iters=args.iters,
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(out, json.dumps({"meta": meta, "rows": rows}, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
