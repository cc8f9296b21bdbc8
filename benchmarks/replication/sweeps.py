"""The GPU group's sweeps (plan.py parts tune, alpha, backend, batch) as report tables: one row per planned
run, its result where it exists, "not run" where it does not. One seed per value: no interval, no verdict.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from benchmarks.replication.claims import BB
from benchmarks.replication.formatting import fmt_cell
from benchmarks.replication.gpu_plan import GPU_SCALE, gpu_runs

PARTS: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {
    "tune": (
        (
            "Equal tuning, 3 values of each method's knob, judged on the held-out 10 % of the training split "
            "(kNN@5 there; the test split is not read)"
        ),
        (
            (f"{BB}knn_k5_majority", "held-out kNN@5"),
            (f"{BB}linear_top1", "held-out linear"),
            (f"{BB}kmeans.ami", "K-Means AMI"),
        ),
    ),
    "alpha": (
        "Hypersolid's α with the paper's λ = 1e-6 and with an effective λ = 1e-2",
        (
            (f"{BB}knn_k5_majority", "kNN@5"),
            (f"{BB}kmeans.ami", "K-Means AMI"),
            (f"{BB}hdbscan_mcs10.ami", "HDBSCAN AMI mcs 10"),
            (f"{BB}geometry.sparsity", "sparsity"),
            (f"{BB}geometry.anisotropy", "anisotropy"),
            ("protocol.exclusion.same_class_frac", "same-class in zone"),
            ("protocol.exclusion.diff_class_frac", "diff-class in zone"),
        ),
    ),
    "backend": (
        "The neighbours backend (k ≪ batch) against the exact dense repulsion",
        ((f"{BB}knn_k5_majority", "kNN@5"), (f"{BB}linear_top1", "linear"), (f"{BB}kmeans.ami", "K-Means AMI")),
    ),
    "batch": (
        "Global batch 128 / 512 / 2048, square-root learning-rate scaling from 128",
        ((f"{BB}knn_k5_majority", "kNN@5"), (f"{BB}linear_top1", "linear"), (f"{BB}kmeans.ami", "K-Means AMI")),
    ),
}


def sweep_lines(runs: Sequence[dict[str, Any]]) -> list[str]:
    """Markdown for every sweep part of the GPU plan at its default scale."""
    done = {r["run"]: r for r in runs}
    out = ["### GPU group: sweeps", ""]
    for part, (title, metrics) in PARTS.items():
        planned = [r for r in gpu_runs(GPU_SCALE) if r.part == part]
        n_done = sum(r.name in done for r in planned)
        out += [f"**{part}**: {title}. {n_done} of {len(planned)} runs done.", ""]
        out.append("| run | settings | epochs | " + " | ".join(label for _, label in metrics) + " |")
        out.append("|---|---|---|" + "---|" * len(metrics))
        for p in planned:
            r = done.get(p.name)
            settings = ", ".join(o for o in p.overrides if not o.startswith("data.eval_split")) or "defaults"
            if r is None:
                out.append(f"| {p.name} | {settings} | {p.epochs} | " + " | ".join("not run" for _ in metrics) + " |")
                continue
            cells = [fmt_cell(r["final"], k) for k, _ in metrics]
            out.append(f"| {p.name} | {settings} | {r['epochs']} | " + " | ".join(cells) + " |")
        out.append("")
    return out
