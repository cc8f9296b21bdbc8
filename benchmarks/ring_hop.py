"""One hop of the ``ring`` backend on one device: the block a rank computes while the next block travels.

    python -m benchmarks.ring_hop [--device cuda|cpu] [--rows 512 1024 2048] [--dim 1024] [--quick]

Per hop a rank computes its m rows against another rank's m rows (``losses/repulsion.remote_block``: the value
and the exact gradient rows in one pass), and with ``screen=bf16`` first screens them in bfloat16
(``losses/screening.screen_columns``). The cost model of docs/design.md §3f assumes the hop's transfer (m·D·4
bytes, or ·2 in bf16) hides behind that computation; this measures the computation, on whatever device runs it,
in a ``spread`` batch (few pairs inside α, as once trained) and a ``collapsed`` one (every pair inside α), and
sets the transfer beside it at two link speeds (NVLink 450 GB/s in a node, InfiniBand 50 GB/s a GPU across
nodes): ``hides_behind_compute`` says where compute ≥ transfer. No process group: the transfer itself is not
measured (one GPU cannot host a multi-rank NCCL group). Median of ``--repeat`` runs after a warm-up. Writes
runs/bench/ring_hop.json and .png (``--out`` elsewhere); gpu_suite.sh runs it as its part ``ring_hop``.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks import common
from hypersolid_scale.safety import atomic

LINKS_GBPS = {"nvlink": 450.0, "infiniband": 50.0}  # bytes per second / 1e9, per GPU
ALPHA = 0.9


def rows_of(regime: str, m: int, dim: int, views: int, seed: int, device: str) -> torch.Tensor:
    """(m, dim) unit rows: ``spread`` (images in random directions, views near their image) or ``collapsed``
    (every row near one direction: every pair inside α)."""
    g = torch.Generator().manual_seed(seed)
    if regime == "collapsed":  # the one direction is the same on every rank; the noise is the rank's own
        x = torch.randn(dim, generator=torch.Generator().manual_seed(0)) + 0.01 * torch.randn(m, dim, generator=g)
    else:
        x = torch.randn(m // views, dim, generator=g).repeat_interleave(views, dim=0)
        x = x + 0.3 * torch.randn(m, dim, generator=g)
    return F.normalize(x, dim=-1).to(device)


def median_s(fn: Any, device: torch.device, repeat: int) -> float:
    times = []
    for i in range(repeat + 1):
        common.sync(device)
        start = time.perf_counter()
        fn()
        common.sync(device)
        if i:  # the first run is the warm-up
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(m: int, dim: int, regime: str, tile: int, repeat: int, device: torch.device) -> dict[str, Any]:
    from hypersolid_scale.losses.repulsion import PairLayout, RepulsionStats, remote_block
    from hypersolid_scale.losses.screening import screen_columns, screen_threshold, screening_bound

    rows, cols = rows_of(regime, m, dim, 8, 0, str(device)), rows_of(regime, m, dim, 8, 1, str(device))
    layout = PairLayout(0, 8)
    block_s = median_s(
        lambda: remote_block(rows, cols, layout, ALPHA, tile, RepulsionStats.zeros(device)), device, repeat
    )
    threshold = screen_threshold(
        torch.tensor(1.0, dtype=torch.float64, device=device), ALPHA, screening_bound(dim, torch.bfloat16)
    )
    r16, c16 = rows.to(torch.bfloat16), cols.to(torch.bfloat16)
    screen_s = median_s(lambda: screen_columns(r16, c16, threshold, tile), device, repeat)
    needed = float(screen_columns(r16, c16, threshold, tile).float().mean())
    fp32_bytes = m * dim * 4
    row: dict[str, Any] = {
        "rows": m,
        "dim": dim,
        "regime": regime,
        "block_s": block_s,
        "screen_bf16_s": screen_s,
        "columns_needed_after_screen": needed,  # the share sent again in fp32 (and computed exactly)
        "hop_bytes_fp32": fp32_bytes,
        "hop_bytes_bf16": fp32_bytes // 2,
    }
    for link, gbps in LINKS_GBPS.items():
        transfer = fp32_bytes / (gbps * 1e9)
        row[f"transfer_fp32_s_{link}"] = transfer
        row[f"hides_behind_compute_{link}"] = block_s >= transfer
    return row


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    with common.figure(path, 120, figsize=(6.4, 4.2)) as (_, ax):
        for regime in sorted({r["regime"] for r in rows}):
            sel = [r for r in rows if r["regime"] == regime]
            ax.loglog([r["rows"] for r in sel], [r["block_s"] * 1e3 for r in sel], "o-", label=f"block fp32, {regime}")
            ax.loglog(
                [r["rows"] for r in sel], [r["screen_bf16_s"] * 1e3 for r in sel], "s--", label=f"bf16 screen, {regime}"
            )
        sel = [r for r in rows if r["regime"] == rows[0]["regime"]]
        for link in LINKS_GBPS:
            ax.loglog(
                [r["rows"] for r in sel],
                [r[f"transfer_fp32_s_{link}"] * 1e3 for r in sel],
                ":",
                label=f"transfer fp32, {link}",
            )
        ax.set_xlabel("rows per rank m")
        ax.set_ylabel("ms per hop")
        ax.legend(fontsize=7)


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--rows", type=int, nargs="+", default=[512, 1024, 2048], help="rows per rank m")
    parser.add_argument("--dim", type=int, default=1024, help="embedding width D")
    parser.add_argument("--tile", type=int, default=1024, help="method.hypersolid.tile_size")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per row (median kept)")
    common.add_quick(parser, "small sizes (m = 64, 128; D = 64), for a test of the script")
    common.add_device(parser)
    common.add_out(parser, "ring_hop")
    args = parser.parse_args()
    common.check_device(args.device)
    if args.quick:
        args.rows, args.dim, args.repeat = [64, 128], 64, 1
    device = torch.device(args.device)
    rows = []
    for regime in ("spread", "collapsed"):
        for m in args.rows:
            rows.append(measure(m, args.dim, regime, args.tile, args.repeat, device))
            print(json.dumps(rows[-1]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = common.metadata(device, dim=args.dim, tile=args.tile, repeat=args.repeat, alpha=ALPHA, links_gbps=LINKS_GBPS)
    atomic.write_text(out / "ring_hop.json", json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    plot(rows, out / "ring_hop.png")


if __name__ == "__main__":
    main()
