"""The README's summary of the replication study (between its markers; report.py writes it): at most 15
lines, so that a reader takes it in at a glance: the scope in one line, one table at the longest budget that
has judged a claim (two paired seeds or more; Hypersolid, the best baseline there and the random-init floor),
three lines, what holds, what does not and what cannot be judged here, at that budget, one for the claims about
Hypersolid's own settings (each at its own budget) and one for the family-wise verdicts. Every verdict list and
every other scope is in docs/replication.md; nothing here repeats it.
"""

from __future__ import annotations

from collections.abc import Sequence

from benchmarks.replication.ablations import SCOPE as OWN_SETTINGS
from benchmarks.replication.claims import BB, METHOD_NAMES, REFERENCE
from benchmarks.replication.judging import Comparison, Scope
from benchmarks.replication.tables import _cell

README_METRICS = (
    (f"{BB}knn_k5_majority", "kNN@5 (%)"),
    (f"{BB}linear_top1", "linear (%)"),
    (f"{BB}kmeans.ami", "K-Means AMI"),
    (f"{BB}hdbscan_mcs10.ami", "HDBSCAN AMI (mcs 10)"),
    (f"{BB}geometry.anisotropy", "anisotropy"),
)
SCOPE = (
    "Fashion-MNIST (10 classes), the quickstart's 4-block CNN at 28 px, global batch 128; budgets of 1, 5, 20 "
    "and 100 epochs, the last Hypersolid and SimCLR only, evaluated after 20, 50 and 100 (the paper: 100-200 on "
    "ImageNet-1k and Food-101); views 2 + 4 for Hypersolid and SwAV (the paper: 2 + 6), 2 for SimCLR and Barlow "
    "Twins; α and SimCLR's temperature tuned on a held-out split at 1 epoch, 2 seeds per value, SwAV and Barlow "
    "Twins at their defaults; 5 paired seeds per setting, 3 at 20 and 100 epochs; kNN bank and probe on 10,000 "
    "training images, the probe at one weight decay (1e-4)"
)


def _short(claim: str) -> str:
    return claim.removeprefix("Geometry: Hypersolid's ").split(":", 1)[0] if claim.startswith("Geometry") else claim


def _said(row: dict[str, str]) -> str:
    """A verdict's claim, with the metrics that decided it when only some of the claim's did."""
    return _short(row["claim"]) + (f" ({row['basis']})" if row.get("basis") else "")


def longest(scopes: Sequence[Scope]) -> Scope | None:
    """The last scope (the longest budget, scopes being listed by budget) whose runs exist and pair enough seeds
    to test a claim: with one seed a method, every verdict there would read "not testable", so the summary stays
    at the longest budget that judges something until the longer one has its second seeds."""
    return next((s for s in reversed(scopes) if s.cmp is not None and len(s.cmp.methods) > 1 and _tested(s.cmp)), None)


def _tested(cmp: Comparison) -> bool:
    """Whether any method was compared with Hypersolid (a paired difference exists: two paired seeds or more)."""
    return any(diffs for by_method in cmp.diffs.values() for diffs in by_method.values())


def readme_block(
    scope: Scope | None, floor: dict[str, dict[int, float]], rows: Sequence[dict[str, str]], reruns: Sequence[str]
) -> str:
    """The summary at ``scope`` (None: nothing has run), ``floor`` the random-init values by metric and seed,
    ``rows`` every verdict (those of ``scope`` are summarised), ``reruns`` the reruns' agreement."""
    link = (
        "[docs/replication.md](docs/replication.md) (generated from "
        "[benchmarks/results/replication/](benchmarks/results/replication/)) has every scope, test and verdict"
    )
    if scope is None or scope.cmp is None:
        return f"**Replication study**: nothing has run yet; {link}.\n"
    cmp: Comparison = scope.cmp
    others = [m for m in cmp.methods if m != REFERENCE]
    knn = README_METRICS[0][0]
    # "Best" only among the baselines that ran at this budget (amendment 3; the README says which those are) and
    # that pair two seeds or more with Hypersolid there: a baseline whose first seed has just landed would be
    # picked on one seed's number against the others' means; it is named, with its number of seeds. Paired as the
    # verdicts pair it: a paired difference to Hypersolid exists (two paired seeds or more).
    compared = [m for m in others if cmp.diff(m, knn) is not None] or others
    unpaired = [m for m in others if m not in compared]
    best = max(compared, key=lambda m: _cell_mean(cmp.values[m].get(knn)))
    if len(compared) == 1:
        best_label = (
            f"{METHOD_NAMES[best]} (the only baseline {'with two seeds or more' if unpaired else 'run'} at this budget"
        )
    else:
        best_label = f"{METHOD_NAMES[best]} (best by kNN@5 of the baselines run here: "
        best_label += ", ".join(METHOD_NAMES[m] for m in compared)
    if unpaired:
        best_label += "; not compared yet, fewer than two seeds: " + ", ".join(
            f"{METHOD_NAMES[m]} ({len(cmp.values[m].get(knn) or {})})" for m in unpaired
        )
    best_label += ")"
    lines = [
        f"**Replication study, at its scope**: {SCOPE}.",
        "",
        f"| {scope.key}: mean [95 % interval] | " + " | ".join(label for _, label in README_METRICS) + " |",
        "|---|" + "---|" * len(README_METRICS),
    ]
    for name, values in (
        (METHOD_NAMES[REFERENCE], cmp.values[REFERENCE]),
        (best_label, cmp.values[best]),
        ("random init", floor),
    ):
        lines.append(f"| {name} | " + " | ".join(_cell(values.get(k), "–") for k, _ in README_METRICS) + " |")
    # The scope's claims; those about Hypersolid's own settings (judged between its own runs, each at its own
    # budget, not the table's) get a line of their own that names each one's budget.
    mine = [r for r in rows if r["scope"] == scope.label]
    own = [r for r in rows if r["short"] == OWN_SETTINGS]
    said = {
        "Holds": [r for r in mine if r["verdict"] == "holds here"],
        "Does not hold": [r for r in mine if r["verdict"] == "does not hold here"],
        "Cannot be judged here": [r for r in mine if r["verdict"] == "not testable here"],
    }
    inconclusive = [r for r in mine if r["verdict"] == "inconclusive here"]
    lines.append("")
    for head, rs in said.items():
        why = " (not measured, or their runs not finished)" if head.startswith("Cannot") else ""
        lines.append(f"* **{head}**{why}: " + ("; ".join(_said(r) for r in rs) or "none") + ".")
        if head == "Holds" and unpaired:  # a claim holds against every baseline: none can before these are paired
            names = " and ".join(METHOD_NAMES[m] for m in unpaired)
            lines[-1] += f" None can until {names} {'has' if len(unpaired) == 1 else 'each have'} two seeds."
    if inconclusive:
        lines[-1] += " Inconclusive at this budget: " + "; ".join(_short(r["claim"]) for r in inconclusive) + "."
    if own:
        lines.append(
            f"* **{OWN_SETTINGS}** (its runs against each other, each at its own budget): "
            + "; ".join(f"{_said(r)} — {r['scoped']}" for r in own)
            + "."
        )
    judged = [r for r in mine if r["verdict"] != "not testable here"]
    fw_holds = [_short(r["claim"]) for r in judged if r["familywise"] == "holds here"]
    fw_not = [_short(r["claim"]) for r in judged if r["familywise"] == "does not hold here"]
    families = len({r["family"] for r in judged})
    lines.append(
        f"* **Family-wise** (Bonferroni over the {families} claim families judged here): holds: "
        f"{'; '.join(fw_holds) or 'none'}; does not hold: {'; '.join(fw_not) or 'none'}."
    )
    rerun = f" Reruns: {'; '.join(reruns)}." if reruns else ""
    lines += ["", f"{link}.{rerun}"]
    return "\n".join(lines) + "\n"


def _cell_mean(vals: dict[int, float] | None) -> float:
    return sum(vals.values()) / len(vals) if vals else float("-inf")
