"""The evaluation report: a console table, ``report.json`` (everything) and ``report.md`` (for humans).

Metrics that could not run on the data are listed with their reason (``report["skipped"]``) in all three.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from hypersolid_scale.safety import atomic

# Metric name -> (section, label, format). Order of this table = order of the printed report.
LAYOUT: list[tuple[str, str, str, str]] = [
    ("knn_", "kNN", "{name}", "{:.2f} %"),
    ("linear_top1", "linear probe", "top-1", "{:.2f} %"),
    ("linear_train_top1", "linear probe", "train top-1", "{:.2f} %"),
    ("linear_val_top1", "linear probe", "held-out top-1 (wd selection)", "{:.2f} %"),
    ("linear_weight_decay", "linear probe", "weight decay", "{:.0e}"),
    ("kmeans_", "K-Means", "{name}", "{:.4g}"),
    ("dbscan_best_", "DBSCAN", "{name}", "{:.4g}"),
    ("hdbscan_", "HDBSCAN", "{name}", "{:.4g}"),
    ("anisotropy", "geometry", "anisotropy", "{:.4f}"),
    ("feature_correlation", "geometry", "feature correlation", "{:.4f}"),
    ("center_vector_norm", "geometry", "center vector norm", "{:.4f}"),
    ("centroid_rank", "geometry", "centroid effective rank", "{:.1f}"),
    ("embedding_rank", "geometry", "embedding effective rank", "{:.1f}"),
    ("sparsity", "geometry", "sparsity", "{:.2%}"),
    ("d_prime", "geometry", "d'", "{:.3f}"),
    ("mean_pairwise_angle_deg", "geometry", "mean pairwise angle", "{:.2f} deg"),
    ("pos_cos_mean", "geometry", "mean cos, same class", "{:.4f}"),
    ("neg_cos_mean", "geometry", "mean cos, different class", "{:.4f}"),
    ("selectivity_", "dimension selectivity", "% dims active for {name} classes", "{:.1f}"),
    ("interp_", "interpolation", "{name}", "{:.4f}"),
]


def _row(key: str, value: Any) -> tuple[str, str, str]:
    for prefix, section, label, fmt in LAYOUT:
        if key == prefix or (prefix.endswith("_") and key.startswith(prefix)):
            name = key[len(prefix) :] if prefix.endswith("_") else key
            numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
            # Counts (clusters, samples) print as integers whatever the section's float format.
            text = str(value) if not numeric or (isinstance(value, int) and "%" not in fmt) else fmt.format(value)
            return section, label.format(name=name), text
    return "other", key, f"{value:.4g}" if isinstance(value, float) else str(value)


def table_rows(metrics: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(section, metric, formatted value), in the report's order."""
    order = {prefix: i for i, (prefix, *_rest) in enumerate(LAYOUT)}

    def rank(key: str) -> int:
        return next((order[p] for p in order if key == p or (p.endswith("_") and key.startswith(p))), len(order))

    # Stable sort: metrics of one section keep the order they were computed in.
    return [_row(k, metrics[k]) for k in sorted(metrics, key=rank)]


def format_table(metrics: dict[str, Any], title: str = "", skipped: dict[str, str] | None = None) -> str:
    """The metrics as an aligned console table, followed by one line per skipped metric and its reason."""
    rows = table_rows(metrics)
    w1 = max([len(r[0]) for r in rows] + [7])
    w2 = max([len(r[1]) for r in rows] + [6])
    lines = [title] if title else []
    lines.append(f"{'section':<{w1}}  {'metric':<{w2}}  value")
    lines.append(f"{'-' * w1}  {'-' * w2}  {'-' * 12}")
    lines += [f"{s:<{w1}}  {m:<{w2}}  {v}" for s, m, v in rows]
    if not rows:
        lines.append("(no metric could be computed)")
    if skipped:
        lines += ["", f"skipped ({len(skipped)}):"] + [f"  {name}: {why}" for name, why in skipped.items()]
    return "\n".join(lines)


def _clean(obj: Any) -> Any:
    """JSON-safe copy: NaN/inf become None (strict JSON), numpy scalars become Python numbers."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def write_report(report: dict[str, Any], out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``report.json`` and ``report.md`` into ``out_dir``; returns both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "report.json", out / "report.md"
    atomic.write_json(json_path, _clean(report), indent=2)
    meta = report.get("meta", {})
    lines = [f"# Evaluation of `{meta.get('checkpoint', '?')}`", ""]
    lines += [f"- {k}: `{v}`" for k, v in meta.items() if k != "checkpoint"]
    lines += ["", "| section | metric | value |", "|---|---|---|"]
    lines += [f"| {s} | {m} | {v} |" for s, m, v in table_rows(report.get("metrics", {}))]
    sweep = report.get("dbscan", [])
    if sweep:
        lines += [
            "",
            "## DBSCAN sweep (cosine distance)",
            "",
            "| eps | NMI | ARI | clusters | noise |",
            "|---|---|---|---|---|",
        ]
        for r in sweep:
            if r.get("nmi") is None:
                lines.append(f"| {r['eps']:.3f} | skipped: {r.get('skipped', '')} | | | |")
            else:
                lines.append(
                    f"| {r['eps']:.3f} | {r['nmi']:.4f} | {r['ari']:.4f} | {r['n_clusters']} | "
                    f"{r['noise_fraction']:.2%} |"
                )
    if report.get("skipped"):
        lines += ["", "## Skipped", "", "| metric | reason |", "|---|---|"]
        lines += [f"| {name} | {why.replace('|', '/')} |" for name, why in report["skipped"].items()]
    if report.get("plots"):
        lines += ["", "## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in report["plots"]]
    if report.get("timings_s"):
        lines += ["", "## Time (s)", ""] + [f"- {k}: {v:.1f}" for k, v in report["timings_s"].items()]
    atomic.write_text(md_path, "\n".join(lines) + "\n")
    return json_path, md_path
