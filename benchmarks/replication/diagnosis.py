"""The report's HDBSCAN diagnosis (amendments 3 and 4 of docs/replication.md): what HDBSCAN did at each setting on
the 20-epoch checkpoints (Hypersolid's and SimCLR's: the 100-epoch runs' epoch 20) and the random inits (the runs'
``hdbscan_grid`` rows, eval/hdbscan_grid.py), beside the AMI the claims are judged on: the number of clusters, the
noise share and the largest cluster's share.

The setting closest to the paper's: 50 images per class (ImageNet-1k's validation split), the backbone's raw
features, Euclidean distance, excess-of-mass selection, min_cluster_size 5 and min_samples 5 (the ``hdbscan``
package's defaults; the paper states none of them). The section says in words what its table shows there.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.replication.claims import METHOD_NAMES, N_CLASSES
from benchmarks.replication.formatting import fmt_interval
from benchmarks.replication.stats import t_interval

PAPER_SETTING = {"per_class": 50, "norm": "raw", "metric": "euclidean", "selection": "eom", "mcs": 5, "ms": 5}
# The protocol's own setting family (cosine, excess of mass, min_samples = min_cluster_size) on the larger sample.
SWEEP = {"per_class": 200, "metric": "cosine", "selection": "eom"}
KINDS = ("backbone", "projector")
SHOWN = (("n_clusters", "clusters"), ("noise_fraction", "noise"), ("largest_fraction", "largest"), ("ami", "AMI"))


def _label(run: dict[str, Any]) -> str:
    if "random" in run["run"]:
        return "random init"
    if run["part"] == "l2":
        return "Hypersolid λ 0"
    return METHOD_NAMES[run["method"]]


def _key(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["per_class"], row["norm"], row["metric"], row["selection"], row["min_cluster_size"], row["min_samples"])


def _rows(run: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """The run's grid rows of one feature kind ([] where that kind was not diagnosed)."""
    return (run.get("hdbscan_grid", {}).get(kind) or {}).get("rows") or []


def _values(runs: Sequence[dict[str, Any]], kind: str) -> dict[str, dict[tuple[Any, ...], dict[str, list[float]]]]:
    """label -> setting -> score -> one value per seed."""
    out: dict[str, dict[tuple[Any, ...], dict[str, list[float]]]] = {}
    for r in runs:
        for row in _rows(r, kind):
            per = out.setdefault(_label(r), {}).setdefault(_key(row), {})
            for score, _ in SHOWN:
                per.setdefault(score, []).append(float(row[score]))
    return out


def _cell(vals: list[float] | None) -> str:
    if not vals:
        return "–"
    return fmt_interval(t_interval(vals))


def diagnosis_lines(runs: Sequence[dict[str, Any]], appendix: Path, link: Any) -> tuple[list[str], str]:
    """The section (``link(path)``: a relative link to ``appendix``) and the appendix's text (every setting)."""
    diagnosed = [r for r in runs if r.get("hdbscan_grid")]
    out = ["### CPU group: HDBSCAN diagnosed (20 epochs and the random inits)", ""]
    if not diagnosed:
        out += [
            (
                "Not run yet: part `diag` of the plan (the random inits), the final checkpoints of parts `l2` and "
                "`long`'s baselines and the epoch-20 checkpoints of part `curve100` get the hdbscan_grid suite."
            ),
            "",
        ]
        return out, ""
    values = {kind: _values(diagnosed, kind) for kind in KINDS}  # once per kind, for both tables
    p = PAPER_SETTING
    paper = (p["per_class"], p["norm"], p["metric"], p["selection"], p["mcs"], p["ms"])
    out += [
        (
            "The setting closest to the paper's (it states none): 50 images per class (ImageNet-1k's validation "
            "split), raw backbone features, Euclidean distance, excess of mass, min_cluster_size 5, min_samples 5 "
            "(the hdbscan package's defaults). Mean [95 % t-interval] (n seeds); noise and largest: shares of the "
            "subsample."
        ),
        "",
        "| features | method | " + " | ".join(label for _, label in SHOWN) + " |",
        "|---|---|" + "---|" * len(SHOWN),
    ]
    for kind in KINDS:
        for label, per in values[kind].items():
            vals = per.get(paper, {})
            out.append(f"| {kind} | {label} | " + " | ".join(_cell(vals.get(s)) for s, _ in SHOWN) + " |")
    out += ["", _reading(values, paper), ""]
    out += [
        (
            "Over min_cluster_size (min_samples equal to it), 200 images per class, cosine distance, excess of mass: "
            "clusters / noise share / AMI, mean over seeds."
        ),
        "",
    ]
    sweep = (SWEEP["per_class"], SWEEP["metric"], SWEEP["selection"])
    sizes = sorted(
        {k[4] for kind in KINDS for per in values[kind].values() for k in per if (k[0], k[2], k[3]) == sweep}
    )
    out += ["| features | method | " + " | ".join(f"mcs {m}" for m in sizes) + " |", "|---|---|" + "---|" * len(sizes)]
    for kind in KINDS:
        for norm in ("raw", "centred"):
            for label, per in values[kind].items():
                cells = []
                for m in sizes:
                    vals = per.get((SWEEP["per_class"], norm, SWEEP["metric"], SWEEP["selection"], m, m), {})
                    cells.append(
                        " / ".join(
                            f"{sum(vals[s]) / len(vals[s]):.{d}f}"
                            for s, d in (("n_clusters", 1), ("noise_fraction", 2), ("ami", 3))
                        )
                        if vals
                        else "–"
                    )
                out.append(f"| {kind} {norm} | {label} | " + " | ".join(cells) + " |")
    out += ["", f"Every setting, with the cluster sizes: [{appendix.name}]({link(appendix)}).", ""]
    return out, _appendix(diagnosed)


def _mean(vals: list[float]) -> float:
    return sum(vals) / len(vals)


def _reading(
    values: dict[str, dict[str, dict[tuple[Any, ...], dict[str, list[float]]]]], paper: tuple[Any, ...]
) -> str:
    """What the table above shows, in words, from its means: how each method's cluster count stands against the
    classes, whether one cluster holds most of the subsample (classes merged), and whose AMI is highest."""
    said = []
    for kind in KINDS:
        at = {label: per[paper] for label, per in values[kind].items() if paper in per}
        if not at:
            continue
        counts = ", ".join(f"{label} {_mean(v['n_clusters']):.1f}" for label, v in at.items())
        fewer = [label for label, v in at.items() if _mean(v["n_clusters"]) < N_CLASSES]
        if len(fewer) == len(at):
            against = f"all find fewer clusters than the {N_CLASSES} classes ({counts})"
        else:
            against = f"fewer clusters than the {N_CLASSES} classes: {', '.join(fewer) or 'none'} ({counts})"
        merged = [label for label, v in at.items() if _mean(v["largest_fraction"]) > 0.5]
        ami = {label: round(_mean(v["ami"]), 3) for label, v in at.items()}
        top = [label for label, a in ami.items() if a == max(ami.values())]  # ties named together
        one = [label for label, v in at.items() if len(v["ami"]) < 2]
        seeds = f" (one seed so far: {', '.join(one)})" if one else ""
        said.append(
            f"{kind} features{seeds}: {against}; one cluster "
            f"holds more than half of the subsample for {', '.join(merged) or 'none'}; the highest AMI is "
            f"{' and '.join(top)}'s ({max(ami.values()):.3f})"
        )
    return "What it shows, in means over seeds: " + "; ".join(said) + "."


def _appendix(runs: Sequence[dict[str, Any]]) -> str:
    lines = [
        "# HDBSCAN diagnosed: every setting of every diagnosed checkpoint",
        "",
        (
            "Generated by `python -m benchmarks.replication.report`; one row per run, feature kind and setting "
            "(sizes: the largest clusters, then the rest)."
        ),
        "",
        "| run | features | per class | norm | metric | selection | mcs | ms | clusters | noise | AMI | sizes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(runs, key=lambda r: r["run"]):
        for kind in sorted(r["hdbscan_grid"]):
            for row in _rows(r, kind):
                sizes = ", ".join(map(str, row["sizes"])) + (f" + {row['sizes_rest']}" if row["sizes_rest"] else "")
                lines.append(
                    f"| {r['run']} | {kind} | {row['per_class']} | {row['norm']} | {row['metric']} | "
                    f"{row['selection']} | {row['min_cluster_size']} | {row['min_samples']} | {row['n_clusters']} | "
                    f"{row['noise_fraction']:.3f} | {row['ami']:.3f} | {sizes} |"
                )
    return "\n".join(lines) + "\n"
