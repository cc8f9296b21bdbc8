"""Plot and markdown table of ``benchmarks.repulsion``'s results (kept apart from the measuring code)."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from benchmarks import common


def plot(rows: list[dict], path: Path, shares: dict | None = None) -> None:
    with common.figure(path, 100, 2, 2, figsize=(12, 8)) as (_, axes):
        regime = next((r["regime"] for r in rows if "seconds" in r), "spread")
        series = sorted({(r["backend"], r.get("dtype", "fp32")) for r in rows if r["regime"] == regime})
        for name, dtype in series:
            pts = sorted(
                (r["m"], r)
                for r in rows
                if r["backend"] == name and r.get("dtype", "fp32") == dtype and r["regime"] == regime and "seconds" in r
            )
            if not pts:
                continue
            ms, label = [p[0] for p in pts], f"{name} {dtype}"
            axes[0, 0].plot(ms, [p[1]["seconds"] for p in pts], marker="o", label=label)
            axes[0, 1].plot(ms, [max(p[1]["peak_bytes"], 1) / 2**30 for p in pts], marker="o", label=label)
            errs = [(p[0], p[1]["loss_rel_err"]) for p in pts if p[1].get("loss_rel_err", 0) > 0]
            if errs:
                axes[1, 0].plot(*zip(*errs), marker="o", label=label)
        for ax, title, unit in (
            (axes[0, 0], "forward+backward time", "seconds"),
            (axes[0, 1], "peak memory", "GiB"),
            (axes[1, 0], "loss relative error vs dense (tiled where dense did not fit)", "rel. err"),
        ):
            ax.set_title(f"{regime}: {title}", fontsize=9)
            ax.set_ylabel(unit)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("M = images x 8 views")
            ax.grid(True, which="both", alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
        ax = axes[1, 1]
        cases = [c for c in (shares or {}).get("cases", []) if "repulsion_share" in c]
        if cases:
            labels = [f"B={c['global_batch']}\nP={c['gpus']}" for c in cases]
            ax.bar(labels, [100 * c["repulsion_share"] for c in cases])
            ax.set_ylabel("% of a ResNet-50 step")
            backend = cast(dict, shares)["repulsion_backend"]  # cases come from shares
            ax.set_title(f"repulsion share ({backend}, per GPU: rows 8B/P x cols 8B)", fontsize=9)
        else:
            ax.set_axis_off()


def summarize(rows: list[dict]) -> list[str]:
    """Markdown table of this run's numbers."""
    lines = [
        "| regime | M | backend | dtype | time (s) | peak mem (GiB) | active pairs | recall | loss rel. err |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (r["regime"], r["m"], r["backend"], r.get("dtype", ""))):
        head = f"| {r['regime']} | {r['m']} | {r['backend']} | {r.get('dtype', 'fp32')} |"
        if "skipped" in r:
            lines.append(f"{head} – | – | – | – | {r['skipped'][:60]} |")
            continue
        rec = f"{r['recall']:.4f}" if "recall" in r else "–"
        err = f"{r['loss_rel_err']:.1e} vs {r['reference']}" if "loss_rel_err" in r else "–"
        lines.append(
            f"{head} {r['seconds']:.3f} | {r['peak_bytes'] / 2**30:.2f} | {r['active_fraction']:.2%} | {rec} | {err} |"
        )
    return lines
