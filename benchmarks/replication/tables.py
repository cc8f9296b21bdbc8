"""The replication report's Markdown tables (report.py assembles them): runs, means with intervals, paired
differences, HDBSCAN's grid, the exclusion zone, step evaluations, every metric, the verdicts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from benchmarks.replication.claims import BB, FAMILY_NAMES, HDBSCAN_MCS, LEVEL, METHOD_NAMES, REFERENCE, methods_in
from benchmarks.replication.formatting import fmt, fmt_cell, fmt_interval
from benchmarks.replication.judging import Comparison, equal_metrics
from benchmarks.replication.stats import t_interval


def run_table(runs: Sequence[dict[str, Any]]) -> list[str]:
    lines = [
        "| method | seeds | steps | training s (mean) | evaluation s (mean) | machine | recorded commit |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in methods_in(runs):
        rs = [r for r in runs if r["method"] == m]
        seeds = ", ".join(str(r["seed"]) for r in sorted(rs, key=lambda r: r["seed"]))
        # Over every attempt where the result has it (a resumed run's last attempt is only its last part).
        train = sum(r.get("train_s_attempts") or r["train_s_total"] or r["train_s"] for r in rs) / len(rs)
        ev = sum(r["eval_s"] for r in rs) / len(rs)
        commits = ", ".join(sorted({r["git_commit"][:7] for r in rs}))
        machines = ", ".join(sorted({f"{r['card']}, torch {r['torch']}" for r in rs}))
        steps = ", ".join(sorted({str(r["final_step"]) for r in rs}))
        lines.append(f"| {METHOD_NAMES[m]} | {seeds} | {steps} | {train:.0f} | {ev:.0f} | {machines} | {commits} |")
    return lines


def _cell(vals: dict[int, float] | None, missing: str = "not run") -> str:
    return fmt_interval(t_interval(list(vals.values()))) if vals else missing


def means_table(
    cmp: Comparison, metrics: Sequence[tuple[str, str]], floor: bool = False, names: dict[str, str] | None = None
) -> list[str]:
    """Mean [95 % interval] (n) per method; ``floor``: a last column with the random-init values ("not run"
    until those runs exist; "–" for a metric they lack)."""
    names = {**METHOD_NAMES, **(names or {})}
    head = "| metric | " + " | ".join(names[m] for m in cmp.methods) + (" | random init |" if floor else " |")
    lines = [head, "|---|" + "---|" * (len(cmp.methods) + floor)]
    for key, label in metrics:
        cells = [_cell(cmp.values[m].get(key)) for m in cmp.methods]
        if floor:
            cells.append(_cell(cmp.floor.get(key), "–") if cmp.floor else "not run")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def diff_table(cmp: Comparison, metrics: Sequence[tuple[str, str]], names: dict[str, str] | None = None) -> list[str]:
    """Per baseline, the paired difference to Hypersolid with its Holm p, corrected within the metric's family
    (the family column)."""
    names = {**METHOD_NAMES, **(names or {})}
    others = [m for m in cmp.methods if m != REFERENCE]
    family = {k: f for f, per in cmp.diffs.items() for diffs in per.values() for k in diffs}
    lines = [
        "| metric | Holm family | " + " | ".join(f"{names[m]} − {names[REFERENCE]} (Holm p)" for m in others) + " |",
        "|---|---|" + "---|" * len(others),
    ]
    for key, label in metrics:
        cells = []
        for m in others:
            d = cmp.diff(m, key)
            if d is None:
                cells.append("fewer than 2 paired seeds")
                continue
            star = " *" if d.p_holm < LEVEL else ""
            cells.append(f"{fmt_interval(d.diff, signed=True)} (p {d.p_holm:.3g}){star}")
        fam = FAMILY_NAMES.get(family.get(key, ""), "–")
        lines.append(f"| {label} | {fam} | " + " | ".join(cells) + " |")
    return lines


def hdbscan_table(cmp: Comparison, floor: bool = False) -> list[str]:
    """Mean AMI / NMI / ARI / noise fraction / clusters per setting and method; ``floor``: a random-init column."""
    columns = [cmp.values[m] for m in cmp.methods] + ([cmp.floor] if floor else [])
    names = [METHOD_NAMES[m] for m in cmp.methods] + (["random init"] if floor else [])
    lines = ["| min_cluster_size | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for mcs in HDBSCAN_MCS:
        cells = []
        for values in columns:
            if not values:
                cells.append("not run")
                continue
            part = []
            for metric in ("ami", "nmi", "ari", "noise_fraction", "n_clusters"):
                vals = list(values.get(f"{BB}hdbscan_mcs{mcs}.{metric}", {}).values())
                part.append(fmt(sum(vals) / len(vals)) if vals else "–")
            cells.append(" / ".join(part))
        lines.append(f"| {mcs} | " + " | ".join(cells) + " |")
    return lines


def exclusion_table(runs: Sequence[dict[str, Any]]) -> list[str]:
    rows = [r for r in runs if r["method"] == REFERENCE]
    lines = [
        "| run | epoch | step | alpha | same-class pairs inside | different-class pairs inside |",
        "|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: r["run"]):
        for e in r["per_epoch"]:
            if "protocol.exclusion.same_class_frac" not in e:
                continue
            lines.append(
                f"| {r['run']} | {e['epoch']} | {e['step']} | {e['protocol.exclusion.alpha']:g} | "
                f"{e['protocol.exclusion.same_class_frac']:.3f} | {e['protocol.exclusion.diff_class_frac']:.3f} |"
            )
    return lines


def all_metrics(cmp: Comparison, title: str) -> str:
    """Every backbone metric of a group (the "rest" family beside the two named ones), one row each."""
    keys = sorted({k for m in cmp.methods for k in cmp.values[m] if k.startswith("protocol.backbone.")})
    others = [m for m in cmp.methods if m != REFERENCE]
    family = {k: f for f, diffs in cmp.diffs.items() for per in diffs.values() for k in per}
    lines = [
        f"# {title}: every backbone metric",
        "",
        (
            "Generated by `python -m benchmarks.replication.report`; do not edit by hand. Mean over seeds per method; "
            "per baseline the paired difference to Hypersolid with its Holm-adjusted p, corrected within the "
            "metric's family (headline, geometry, or rest: every other metric)."
        ),
        "",
        *means_table(cmp, [(k, k.removeprefix("protocol.")) for k in keys]),
        "",
        "| metric | family | " + " | ".join(f"{METHOD_NAMES[m]} − Hypersolid (Holm p)" for m in others) + " |",
        "|---|---|" + "---|" * len(others),
    ]
    for k in keys:
        cells = []
        for m in others:
            d = next((per[m][k] for per in cmp.diffs.values() if k in per.get(m, {})), None)
            cells.append("–" if d is None else f"{fmt_interval(d.diff, signed=True)} (p {d.p_holm:.3g})")
        lines.append(f"| {k.removeprefix('protocol.')} | {family.get(k, '–')} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


STEP_METRICS = (
    (f"{BB}knn_k5_majority", "kNN@5 (%)"),
    (f"{BB}linear_top1", "linear (%)"),
    (f"{BB}kmeans.ami", "K-Means AMI"),
    (f"{BB}hdbscan_mcs10.ami", "HDBSCAN AMI mcs 10"),
    (f"{BB}geometry.anisotropy", "anisotropy"),
    ("protocol.exclusion.same_class_frac", "same-class pairs in the zone"),
    ("protocol.exclusion.diff_class_frac", "different-class pairs in the zone"),
)


def steps_lines(runs: Sequence[dict[str, Any]], plain: Sequence[dict[str, Any]] = ()) -> list[str]:
    """The runs evaluated every few steps (plan part "steps"): the exclusion zone and clustering over training;
    each one's last evaluation set against the plain run of its method and seed (a rerun of it)."""
    out = ["### CPU group: Hypersolid over its first epoch", ""]
    if not runs:
        return [*out, "Not run yet.", ""]
    out += [
        (
            "The protocol on every 100th step's checkpoint of one more Hypersolid run (seed 0, the CPU group's "
            "settings; one seed, no interval). The exclusion zone is cosine > alpha between raw projector outputs."
        ),
        "",
    ]
    for r in runs:
        out += [f"{r['run']} ({r['card']}, torch {r['torch']}, recorded commit {r['git_commit'][:7]}):", ""]
        out.append("| step | epoch | " + " | ".join(label for _, label in STEP_METRICS) + " |")
        out.append("|---|---|" + "---|" * len(STEP_METRICS))
        for e in r["per_epoch"]:
            cells = [fmt_cell(e, k) for k, _ in STEP_METRICS]
            out.append(f"| {e['step']} | {e['epoch']:g} | " + " | ".join(cells) + " |")
        out.append("")
        if (same := rerun(r, plain)) is not None:
            out += [f"A rerun: its last checkpoint's evaluation equals {same}.", ""]
    return out


def verdict_table(rows: Sequence[dict[str, str]]) -> list[str]:
    """One row per claim, one verdict column per scope (budget and tuning), in the rows' order."""
    scopes = list(dict.fromkeys(r["short"] for r in rows))
    claims = list(dict.fromkeys(r["claim"] for r in rows))
    at = {(r["claim"], r["short"]): r for r in rows}
    lines = [
        "| claim of the paper | the paper says | Holm family | " + " | ".join(f"verdict: {s}" for s in scopes) + " |",
        "|---|---|---|" + "---|" * len(scopes),
    ]
    for c in claims:
        first = next(r for r in rows if r["claim"] == c)
        cells = [_cell_verdict(at[(c, s)]) if (c, s) in at else "–" for s in scopes]
        lines.append(f"| {c} | {first['paper']} | {first['family']} | " + " | ".join(cells) + " |")
    return lines


def _cell_verdict(row: dict[str, str]) -> str:
    """A verdict, and the family-wise one beside it where that differs (amendment 3)."""
    fw = row.get("familywise", row["verdict"])
    return f"**{row['verdict']}**" + (f" (family-wise: {fw.removesuffix(' here')})" if fw != row["verdict"] else "")


def evidence_table(rows: Sequence[dict[str, str]], difference: str = "method − Hypersolid") -> list[str]:
    """The verdicts of one scope with their evidence (the closest call where nothing is significant);
    ``difference`` says what the evidence's paired differences subtract."""
    lines = [
        f"| claim | verdict | family-wise | evidence ({difference}, mean [95 % interval], Holm p) |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {r['claim']} | **{r['scoped']}** | {r.get('familywise', r['verdict']).removesuffix(' here')} | "
        f"{r['evidence']} |"
        for r in rows
    ]
    return lines


def rerun(run: dict[str, Any], plain: Sequence[dict[str, Any]]) -> str | None:
    """How a step-evaluated run's last evaluation compares with the plain run of its method and seed, trained
    and evaluated separately: "<run>'s ... on N of M metrics" (None without such a run)."""
    twin = next((p for p in plain if (p["method"], p["seed"]) == (run["method"], run["seed"])), None)
    if twin is None:
        return None
    same = equal_metrics(run["final"], twin["final"])
    return f"{twin['run']}'s (the same seed, trained and evaluated separately) {same}"
