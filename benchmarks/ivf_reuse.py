"""What keeping the IVF quantizer between steps saves, and what it costs in recall (``method.hypersolid.
ivf_retrain_every``, losses/candidates.ReusedIVF).

    python -m benchmarks.ivf_reuse --checkpoints RUN/checkpoints/step_00000500.pt step_00000600.pt ...

The rows: the training loader's first ``--batches`` global batches through each checkpoint's backbone and
projector (benchmarks/neighbor_fanout.py), as the ``neighbors`` backend sees them. For each checkpoint after the
first, one search of its rows against its rows (top-(k+1), nprobe as configured), on the host, three ways:

* ``fresh``: the index trained on these rows, as at every step with ``ivf_retrain_every=1``;
* ``reused``: the quantizer trained on the first checkpoint's rows (its step is ``age_steps`` earlier), the rows
  only assigned to its lists;
* ``exact``: FAISS's flat index, the reference of the recall: the share of each row's true top-k that the search
  returned, and the share of the active pairs (cos > α) among them.

Times are the median of ``--repeat`` runs, in one process; the ratios are what to read. Writes
runs/bench/ivf_reuse.json and .png (``--out`` elsewhere).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks import common
from benchmarks.neighbor_fanout import embed_rows, training_batches
from hypersolid_scale.safety import atomic


def _timed(fn: Any, repeat: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def _recall(ids: np.ndarray, exact_ids: np.ndarray, exact_scores: np.ndarray, alpha: float) -> dict[str, float]:
    """Top-k recall, and the share of the active pairs inside the true top-k that the search returned."""
    hit = [len(set(a) & set(b)) for a, b in zip(ids.tolist(), exact_ids.tolist())]
    active = exact_scores > alpha
    found = [len(set(a) & set(b[m].tolist())) for a, b, m in zip(ids.tolist(), exact_ids, active)]
    return {
        "topk_recall": float(np.sum(hit) / exact_ids.size),
        "active_recall": float(np.sum(found) / max(1, int(active.sum()))),
    }


def measure(xa: np.ndarray, xb: np.ndarray, k: int, nprobe: int, alpha: float, repeat: int) -> dict[str, Any]:
    from hypersolid_scale.losses.candidates import ReusedIVF, faiss_search, ivf_lists

    t_exact, (exact_scores, exact_ids) = _timed(lambda: faiss_search(xb, xb, k, "flat"), repeat)
    t_fresh, (_, fresh_ids) = _timed(lambda: faiss_search(xb, xb, k, "ivf", nprobe=nprobe), repeat)
    reused = ReusedIVF(retrain_every=10**9)
    reused.search(xa, xa, k, nprobe=nprobe)  # the quantizer, trained on the older rows
    t_reused, (_, reused_ids) = _timed(lambda: reused.search(xb, xb, k, nprobe=nprobe), repeat)
    assert reused.trainings == 1
    return {
        "rows": xb.shape[0],
        "dim": xb.shape[1],
        "lists": ivf_lists(xb.shape[0]),
        "k": k,
        "nprobe": nprobe,
        "exact_s": t_exact,
        "fresh_s": t_fresh,
        "reused_s": t_reused,
        "reused_over_fresh": t_reused / t_fresh,
        "fresh": _recall(fresh_ids, exact_ids, exact_scores, alpha),
        "reused": _recall(reused_ids, exact_ids, exact_scores, alpha),
    }


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    age = [r["age_steps"] for r in rows]
    ax1.plot(age, [r["fresh_s"] * 1e3 for r in rows], "o-", label="trained at this step")
    ax1.plot(age, [r["reused_s"] * 1e3 for r in rows], "s-", label="quantizer kept")
    ax1.set(xlabel="steps since the quantizer was trained", ylabel="search (ms)", title="one IVF search, host")
    ax1.legend()
    for kind, marker in (("fresh", "o-"), ("reused", "s-")):
        ax2.plot(age, [r[kind]["topk_recall"] for r in rows], marker, label=f"{kind}: top-k")
        ax2.plot(age, [r[kind]["active_recall"] for r in rows], marker, alpha=0.5, label=f"{kind}: cos > α")
    ax2.set(xlabel="steps since the quantizer was trained", ylabel="recall", title="recall against flat")
    ax2.legend(fontsize=8)
    common.save(fig, path, dpi=110)


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--checkpoints", type=Path, nargs="+", required=True, help="one run's, oldest first")
    parser.add_argument("--batches", type=int, default=8, help="global batches of the training loader to embed")
    parser.add_argument("--k", type=int, default=64, help="candidates per row (method.hypersolid.neighbors.k)")
    parser.add_argument(
        "--nprobe", type=int, default=16, help="lists visited per query (method.hypersolid.neighbors.nprobe)"
    )
    parser.add_argument("--repeat", type=int, default=5, help="runs of each search (the median is kept)")
    common.add_out(parser, "ivf_reuse")
    args = parser.parse_args()

    from hypersolid_scale.checkpoint import load_checkpoint

    torch.manual_seed(0)
    ckpts = [load_checkpoint(p) for p in args.checkpoints]
    batches, alpha = training_batches(ckpts[0], args.batches)
    rows_of = [np.ascontiguousarray(embed_rows(c, batches).numpy().astype(np.float32)) for c in ckpts]
    rows = []
    for ckpt, x in zip(ckpts[1:], rows_of[1:]):
        row = {"trained_at_step": ckpts[0]["step"], "step": ckpt["step"], "age_steps": ckpt["step"] - ckpts[0]["step"]}
        row.update(measure(rows_of[0], x, args.k + 1, args.nprobe, alpha, args.repeat))
        rows.append(row)
        print(json.dumps(row), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = common.metadata("cpu", checkpoints=[str(p) for p in args.checkpoints], batches=args.batches, alpha=alpha)
    atomic.write_text(out / "ivf_reuse.json", json.dumps({"meta": meta, "rows": rows}, indent=2, default=str) + "\n")
    plot(rows, out / "ivf_reuse.png")


if __name__ == "__main__":
    main()
