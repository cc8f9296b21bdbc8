"""The replication study's metric families, paired comparisons and verdict rules (docs/replication.md).

Fixed before the CPU group's results were read. The headline family is the protocol's (kNN@5 and kNN@20,
the linear probe, AMI of K-Means and of every HDBSCAN setting, all on the backbone's raw features; kNN is
the majority vote, the paper's plain top-1 kNN); the geometry family is the paper's Table of geometric
properties, each with the direction the paper reports for Hypersolid against the other methods.

A claim **holds here** when Hypersolid differs from every baseline in the claimed direction on some metric
of the claim at Holm-adjusted p < 0.05 and in the opposite direction on none; it **does not hold here** when
some baseline is better on some metric of the claim at that level; otherwise it is **inconclusive here**.
For claims of parity (kNN and linear probe "competitive") only the second rule applies: no baseline
significantly better is "holds here", provided every baseline was tested (at least two paired seeds);
otherwise it is "inconclusive here".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hypersolid_scale.eval.stats import Interval, PairedDifference, paired_differences

REFERENCE = "hypersolid"
METHOD_NAMES = {"hypersolid": "Hypersolid", "simclr": "SimCLR", "swav": "SwaV", "barlowtwins": "Barlow Twins"}
BB = "protocol.backbone.raw."
HDBSCAN_MCS = (5, 10, 25, 50, 100)
LEVEL = 0.05

HEADLINE: tuple[tuple[str, str], ...] = (
    (f"{BB}knn_k5_majority", "kNN@5 (%)"),
    (f"{BB}knn_k20_majority", "kNN@20 (%)"),
    (f"{BB}linear_top1", "linear probe (%)"),
    (f"{BB}kmeans.ami", "K-Means AMI"),
    *((f"{BB}hdbscan_mcs{m}.ami", f"HDBSCAN AMI, mcs {m}") for m in HDBSCAN_MCS),
)
# (key, label, +1 when the paper reports Hypersolid higher, -1 lower)
GEOMETRY_DIRECTION: tuple[tuple[str, str, int], ...] = (
    (f"{BB}geometry.anisotropy", "anisotropy", -1),
    (f"{BB}geometry.feature_correlation", "feature correlation", -1),
    (f"{BB}geometry.center_vector_norm", "centre-vector norm", -1),
    (f"{BB}geometry.sparsity", "sparsity", +1),
    (f"{BB}geometry.centroid_rank", "centroid rank", -1),
    (f"{BB}geometry.embedding_rank", "embedding rank", -1),
)
GEOMETRY = tuple((k, label) for k, label, _ in GEOMETRY_DIRECTION)
FAMILIES = {"headline": HEADLINE, "geometry": GEOMETRY}


def fmt(v: float) -> str:
    a = abs(v)
    if a >= 1 and float(v).is_integer():  # counts (clusters, pairs) and whole means of them
        return str(int(v))
    return f"{v:.2f}" if a >= 10 else f"{v:.3f}" if a >= 0.01 or v == 0 else f"{v:.2e}"


def fmt_cell(values: dict[str, Any], key: str) -> str:
    """``values[key]`` formatted for a table cell, "–" where that metric is missing or not a number."""
    v = values.get(key)
    return fmt(v) if isinstance(v, (int, float)) else "–"


def fmt_interval(i: Interval, signed: bool = False) -> str:
    f = (lambda v: ("+" if v > 0 else "") + fmt(v)) if signed else fmt
    if i.lo is None or i.hi is None:
        return f"{f(i.mean)} (n = 1)"
    return f"{f(i.mean)} [{fmt(i.lo)}, {fmt(i.hi)}] (n = {i.n})"


def methods_in(runs: Sequence[dict[str, Any]]) -> list[str]:
    """The methods that have runs, in METHOD_NAMES' order (Hypersolid first): every table's and figure's order."""
    present = {r["method"] for r in runs}
    return [m for m in METHOD_NAMES if m in present]


def protocol_numbers(final: dict[str, Any]) -> dict[str, float]:
    """The protocol's numeric metrics of one evaluation (``protocol.`` keys; flags and texts dropped)."""
    return {
        k: float(v)
        for k, v in final.items()
        if k.startswith("protocol.") and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def by_seed(runs: Sequence[dict[str, Any]], method: str) -> dict[str, dict[int, float]]:
    """``{metric: {seed: value}}`` of one method's runs, from each run's final evaluation (numbers only)."""
    out: dict[str, dict[int, float]] = {}
    for r in runs:
        if r["method"] == method:
            for k, v in protocol_numbers(r["final"]).items():
                out.setdefault(k, {})[int(r["seed"])] = v
    return out


@dataclass
class Comparison:
    methods: list[str]
    values: dict[str, dict[str, dict[int, float]]]
    # family -> method -> metric -> paired difference against Hypersolid
    diffs: dict[str, dict[str, dict[str, PairedDifference]]] = field(default_factory=dict)


def compare(runs: Sequence[dict[str, Any]]) -> Comparison:
    """Every method's per-seed values and, per family, its Holm-corrected paired differences to Hypersolid."""
    methods = methods_in(runs)
    values = {m: by_seed(runs, m) for m in methods}
    cmp = Comparison(methods, values)
    ref = values.get(REFERENCE, {})
    named = {k for metrics in FAMILIES.values() for k, _ in metrics}
    # "rest": every other backbone metric (both feature kinds), a third family with its own Holm correction:
    # reported and tested like the others, never promoted to a verdict after the fact.
    rest = {k for m in methods for k in values[m] if k.startswith("protocol.backbone.") and k not in named}
    for family, keys in (*((f, {k for k, _ in metrics}) for f, metrics in FAMILIES.items()), ("rest", rest)):
        cmp.diffs[family] = {
            m: paired_differences({k: v for k, v in values[m].items() if k in keys}, ref)
            for m in methods
            if m != REFERENCE
        }
    return cmp


def _signs(cmp: Comparison, family: str, keys: Sequence[tuple[str, int]]) -> dict[str, list[int | None]]:
    """Per baseline, one sign per metric: +1 Hypersolid significantly ahead in the claimed direction,
    -1 significantly behind it, 0 not significant, None not tested (fewer than two paired seeds)."""
    out: dict[str, list[int | None]] = {}
    for m, diffs in cmp.diffs[family].items():
        signs: list[int | None] = []
        for key, direction in keys:
            d = diffs.get(key)
            if d is None:
                signs.append(None)
            elif d.p_holm >= LEVEL:
                signs.append(0)
            else:  # diff = baseline - Hypersolid; Hypersolid ahead in the claimed direction when its sign is -direction
                signs.append(1 if d.diff.mean * direction < 0 else -1)
        out[m] = signs
    return out


def _verdict(signs: dict[str, list[int | None]], parity: bool = False) -> str:
    if not signs or all(x is None for s in signs.values() for x in s):
        return "not testable here"
    if any(-1 in s for s in signs.values()):
        return "does not hold here"
    # Parity needs every baseline tested on some metric of the claim; superiority needs every one beaten.
    if all(1 in s if not parity else any(x is not None for x in s) for s in signs.values()):
        return "holds here"
    return "inconclusive here"


def _evidence(cmp: Comparison, family: str, keys: Sequence[tuple[str, int]], labels: dict[str, str]) -> str:
    parts = []
    for m, diffs in cmp.diffs[family].items():
        tested = [(key, diffs[key]) for key, _ in keys if key in diffs]
        bits = [
            f"{labels[key]} {fmt_interval(d.diff, signed=True)}, p {d.p_holm:.2g}"
            for key, d in tested
            if d.p_holm < LEVEL
        ]
        if tested and not bits:  # name the closest call, so that a weak test does not read as equality
            key, d = min(tested, key=lambda kd: kd[1].p_holm)
            bits = [f"none significant; closest {labels[key]} {fmt_interval(d.diff, signed=True)}, p {d.p_holm:.2g}"]
        said = "; ".join(bits) if bits else "fewer than two paired seeds"
        parts.append(f"{METHOD_NAMES[m]} − Hypersolid: {said}")
    return " · ".join(parts)


def verdicts(cpu: Comparison | None, gpu: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    """One row per claim of the paper, judged on the CPU group (the GPU group's sweeps are reported, with
    one seed per value they carry no interval and no verdict)."""
    labels = {k: v for fam in FAMILIES.values() for k, v in fam}
    scope = "Fashion-MNIST, 4-block CNN, 1 epoch, CPU group"
    claims: list[tuple[str, str, str, list[tuple[str, int]], bool]] = [
        ("Hypersolid clusters better: K-Means", "headline", "K-Means AMI", [(f"{BB}kmeans.ami", 1)], False),
        (
            "Hypersolid clusters better: HDBSCAN",
            "headline",
            "HDBSCAN AMI, every min_cluster_size",
            [(f"{BB}hdbscan_mcs{m}.ami", 1) for m in HDBSCAN_MCS],
            False,
        ),
        (
            "kNN and linear probe competitive: no baseline significantly ahead",
            "headline",
            "kNN@5, kNN@20, linear probe",
            [(f"{BB}knn_k5_majority", 1), (f"{BB}knn_k20_majority", 1), (f"{BB}linear_top1", 1)],
            True,
        ),
        *(
            (f"Geometry: Hypersolid's {label} is {'higher' if d > 0 else 'lower'}", "geometry", label, [(k, d)], False)
            for k, label, d in GEOMETRY_DIRECTION
        ),
    ]
    rows = []
    for claim, family, metrics, keys, parity in claims:
        if cpu is None or len(cpu.methods) < 2:
            rows.append(
                {
                    "claim": claim,
                    "metrics": metrics,
                    "verdict": "not testable here",
                    "evidence": "the CPU group has not run",
                }
            )
            continue
        signs = _signs(cpu, family, keys)
        rows.append(
            {
                "claim": claim,
                "metrics": f"{metrics} ({scope})",
                "verdict": _verdict(signs, parity),
                "evidence": _evidence(cpu, family, keys, labels),
            }
        )
    have = {r["part"] for r in gpu}
    for claim, part, why in (
        ("The weak L2 term lowers anisotropy and raises sparsity", "alpha", "the α × λ sweep (GPU group, part alpha)"),
        ("Batch 128 is the best global batch", "batch", "global batch 128 / 512 / 2048 (GPU group, part batch)"),
    ):
        rows.append(
            {
                "claim": claim,
                "metrics": why,
                "verdict": "not testable here",
                "evidence": "one seed per value: reported below without a verdict"
                if part in have
                else "the runs have not been done (no GPU lent since the driver was fixed)",
            }
        )
    return rows
