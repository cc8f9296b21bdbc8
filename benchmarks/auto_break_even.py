"""Where ``tiled`` and exact ``neighbors`` (the two sides of ``backend=auto``) really cost the same, and what each
of ``auto``'s two ways of choosing (``auto.by``) runs there.

    python -m benchmarks.auto_break_even [--rows 4096] [--dim 256] [--points 11] [--device cpu|cuda]

Embeddings of ``--rows`` rows go from near collapse (every row inside α of the others, as at a run's start) to
spread, in ``--points`` steps (``embeddings``). At each, the repulsion of ``tiled`` and of exact ``neighbors``
(the sides of ``auto``) is timed forward and backward as ``auto.by=time`` times it (``auto.side_seconds``: the
median of ``--repeat`` runs after one warm-up) with the saturated fraction s that ``neighbors`` reports. Per
point, the JSON names the cheaper side, the side ``auto.by=fraction`` runs there at the default thresholds (below
``auto.to_neighbors``: neighbors; above ``auto.to_tiled``: tiled; between them: whichever it ran before,
"either"), and the side ``auto.by=time`` runs (the cheaper one unless the other is within ``SWITCH_MARGIN``).
Writes runs/bench/auto_break_even.json and .png
(``--out`` elsewhere).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks import common
from hypersolid_scale.safety import atomic


def embeddings(rows: int, dim: int, t: float, seed: int = 0) -> torch.Tensor:
    """(rows, dim) unit rows around one direction, row i at spread ``SPREAD · t · u_i`` (u_i uniform in [0, 1]):
    at ``t`` = 0 every row is saturated (collapse, as at a run's start), and as ``t`` grows the rows leave the
    others' α-caps one by one, so that the saturated fraction falls gradually to near 0."""
    g = torch.Generator().manual_seed(seed)
    centre = torch.randn(dim, generator=g)
    centre = centre / centre.norm()
    spread = SPREAD * t * torch.rand(rows, 1, generator=g)
    return F.normalize(centre + spread * torch.randn(rows, dim, generator=g) / dim**0.5, dim=-1)


SPREAD = 16.0


def plot(rows: list[dict[str, Any]], thresholds: tuple[float, float], path: Path) -> None:
    with common.figure(path, 120, figsize=(6.4, 4.2)) as (_, ax):
        s = [r["saturated_fraction"] for r in rows]
        ax.plot(s, [r["tiled_s"] * 1e3 for r in rows], "o-", label="tiled")
        ax.plot(s, [r["neighbors_s"] * 1e3 for r in rows], "s-", label="neighbors (exact)")
        ax.axvspan(*thresholds, color="grey", alpha=0.2, label="auto.by=fraction: hysteresis band")
        ax.set_xlabel("saturated fraction s")
        ax.set_ylabel("ms per call (forward + backward)")
        ax.legend(fontsize=8)


def fraction_side(s: float, lo: float, hi: float) -> str:
    """What ``auto.by=fraction`` runs at a steady fraction ``s``."""
    return "neighbors" if s < lo else "tiled" if s > hi else "either"


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--rows", type=int, default=4096, help="rows of the global batch (M_g)")
    parser.add_argument("--dim", type=int, default=256, help="embedding width D")
    parser.add_argument("--views", type=int, default=8, help="views per image")
    parser.add_argument("--points", type=int, default=11, help="steps from collapsed to spread")
    parser.add_argument("--k", type=int, default=64, help="candidates per row (method.hypersolid.neighbors.k)")
    parser.add_argument("--index", default="torch", choices=["torch", "flat"], help="the exact search")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per side and point (median kept)")
    common.add_device(parser)
    common.add_out(parser, "auto_break_even")
    args = parser.parse_args()
    common.check_device(args.device)

    from hypersolid_scale.losses.backends.auto import SWITCH_MARGIN, side_seconds
    from hypersolid_scale.losses.backends.neighbors import NeighborsBackend
    from hypersolid_scale.losses.backends.tiled import TiledBackend
    from hypersolid_scale.losses.config import loss_config
    from hypersolid_scale.losses.repulsion import PairLayout

    cfg = loss_config(backend="auto", neighbors={"index": args.index, "k": args.k, "recall_every": 0})
    tiled, neighbors = TiledBackend(cfg, saturation_k=args.k), NeighborsBackend(cfg)
    layout, alpha, band = PairLayout(0, args.views), cfg.alpha, (cfg.auto.to_neighbors, cfg.auto.to_tiled)
    rows: list[dict[str, Any]] = []
    for i in range(args.points):
        t = i / max(1, args.points - 1)
        x = embeddings(args.rows, args.dim, t).to(args.device)
        t_tiled, _ = side_seconds(tiled, x, x, layout, alpha, args.repeat)
        t_neighbors, st = side_seconds(neighbors, x, x, layout, alpha, args.repeat)
        s = float(st.saturated_rows) / args.rows
        cheaper = "tiled" if t_tiled <= t_neighbors else "neighbors"
        by_time = cheaper if min(t_tiled, t_neighbors) < SWITCH_MARGIN * max(t_tiled, t_neighbors) else "either"
        rows.append(
            {
                "t": t,
                "saturated_fraction": s,
                "tiled_s": t_tiled,
                "neighbors_s": t_neighbors,
                "cheaper": cheaper,
                "auto_by_fraction": fraction_side(s, *band),
                "auto_by_time": by_time,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    wrong = [r["saturated_fraction"] for r in rows if r["auto_by_fraction"] not in (r["cheaper"], "either")]
    summary = {
        "neighbors_cheaper_at": [r["saturated_fraction"] for r in rows if r["cheaper"] == "neighbors"],
        "auto_by_fraction_runs_the_dearer_side_at": wrong,
        "auto_by_fraction_thresholds": list(band),
        "switch_margin": SWITCH_MARGIN,
    }
    print(json.dumps(summary), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = common.metadata(
        args.device, rows=args.rows, dim=args.dim, views=args.views, k=args.k, index=args.index, repeat=args.repeat
    )
    doc = {"meta": meta, "summary": summary, "rows": rows}
    atomic.write_text(out / "auto_break_even.json", json.dumps(doc, indent=2) + "\n")
    plot(rows, band, out / "auto_break_even.png")


if __name__ == "__main__":
    main()
