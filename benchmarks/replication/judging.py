"""The replication study's paired comparisons and verdicts on the claims of claims.py (docs/replication.md).

A claim **holds here** when Hypersolid differs from every baseline in the claimed direction on some metric
of the claim at Holm-adjusted p < 0.05 and in the opposite direction on none; it **does not hold here** when
some baseline is better on some metric of the claim at that level; otherwise it is **inconclusive here**.
A claim of parity (kNN and linear probe "competitive") is judged against its equivalence margin (amendment 3,
TOST's one-sided tests, Holm over the claim's metrics): it holds when every baseline is shown to be ahead by less
than the margin (or behind) on every metric tested, does not hold when some baseline is shown to be ahead by more
than the margin, and is inconclusive otherwise. Every verdict is stated with its scope (budget and tuning):
"does not hold after 1 epoch, each method's untuned defaults" says nothing of the paper's 100-200 epochs.

Beside each verdict, the family-wise one (amendment 3): the same rule with every Holm-adjusted p multiplied by the
number of Holm families judged at the scope (Bonferroni across the claims' families, on top of Holm within each),
which bounds the chance of any false verdict at the scope by 0.05.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmarks.replication.claims import (
    BB,
    CLAIMS,
    CLASS_GAP,
    DBSCAN_BEST,
    FAMILIES,
    FAMILY_NAMES,
    INTERP_RATIO,
    LEVEL,
    METHOD_NAMES,
    N_CLASSES,
    REFERENCE,
    Claim,
    methods_in,
)
from benchmarks.replication.formatting import fmt_interval
from benchmarks.replication.stats import MarginTest, PairedDifference, margin_tests, paired_differences


def protocol_numbers(final: dict[str, Any]) -> dict[str, float]:
    """The protocol's numeric metrics of one evaluation (``protocol.`` keys; flags and texts dropped)."""
    return {
        k: float(v)
        for k, v in final.items()
        if k.startswith("protocol.") and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def equal_metrics(ours: dict[str, Any], theirs: dict[str, Any]) -> str:
    """ "on N of M metrics": how many of evaluation ``theirs``'s protocol metrics evaluation ``ours`` equals exactly
    (a rerun, or the same weights reached by another run)."""
    mine, other = protocol_numbers(ours), protocol_numbers(theirs)
    return f"on {sum(mine.get(k) == v for k, v in other.items())} of {len(other)} metrics"


def derived(values: dict[str, float]) -> dict[str, float]:
    """``values`` with the metrics the report derives: the best DBSCAN NMI over the eps grid (of the eps
    values evaluated; a radius whose graph exceeds the edge budget is skipped by the protocol)."""
    nmi = [v for k, v in values.items() if k.startswith(f"{BB}dbscan_q") and k.endswith(".nmi")]
    out = {**values, DBSCAN_BEST: max(nmi)} if nmi else dict(values)
    pos, neg = values.get(f"{BB}geometry.interp_pos_peak"), values.get(f"{BB}geometry.interp_neg_peak")
    if INTERP_RATIO not in out and pos and neg is not None:
        out[INTERP_RATIO] = neg / pos
    for gap, _ in CLASS_GAP:  # |clusters - classes| from the recorded count
        count = values.get(gap.replace(".class_gap", ".n_clusters"))
        if count is not None:
            out[gap] = abs(count - N_CLASSES)
    return out


def by_seed(
    runs: Sequence[dict[str, Any]], method: str, entry: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None
) -> dict[str, dict[int, float]]:
    """``{metric: {seed: value}}`` of one method's runs, from each run's final evaluation (numbers only) or
    the evaluation ``entry(run)`` picks (a run where it gives None is left out)."""
    out: dict[str, dict[int, float]] = {}
    for r in runs:
        if r["method"] == method:
            e = r["final"] if entry is None else entry(r)
            if e is None:
                continue
            for k, v in derived(protocol_numbers(e)).items():
                out.setdefault(k, {})[int(r["seed"])] = v
    return out


@dataclass
class Comparison:
    methods: list[str]
    values: dict[str, dict[str, dict[int, float]]]
    # family -> method -> metric -> paired difference against Hypersolid
    diffs: dict[str, dict[str, dict[str, PairedDifference]]] = field(default_factory=dict)
    # The random-init floor (the initial weights' values by seed), shown beside the methods, never tested.
    floor: dict[str, dict[int, float]] = field(default_factory=dict)

    def diff(self, method: str, key: str) -> PairedDifference | None:
        """``method`` − Hypersolid on ``key``, Holm-corrected within the family that holds ``key``."""
        return next((per[method][key] for per in self.diffs.values() if key in per.get(method, {})), None)


def compare(
    runs: Sequence[dict[str, Any]],
    floor: Sequence[dict[str, Any]] = (),
    entry: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None,
) -> Comparison:
    """Every method's per-seed values and, per family, its Holm-corrected paired differences to Hypersolid;
    ``floor``: the random-init runs; ``entry``: which evaluation of a run (default its final one)."""
    methods = methods_in(runs)
    values = {m: by_seed(runs, m, entry) for m in methods}
    cmp = Comparison(methods, values, floor=by_seed(floor, REFERENCE) if floor else {})
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


def signs_of(
    diffs: dict[str, PairedDifference], keys: Sequence[tuple[str, int]], scale: float = 1.0
) -> list[int | None]:
    """One sign per (key, claimed direction), ``diffs`` holding other − claimed: +1 the claimed side significantly
    ahead in the claimed direction, -1 significantly behind, 0 not significant, None not tested (fewer than two
    paired seeds); ``scale`` multiplies the Holm-adjusted p (the family-wise verdict's Bonferroni factor)."""
    out: list[int | None] = []
    for key, direction in keys:
        d = diffs.get(key)
        if d is None:
            out.append(None)
        elif d.p_holm * scale >= LEVEL:
            out.append(0)
        else:  # the claimed side ahead in the claimed direction when other − claimed has the sign of -direction
            out.append(1 if d.diff.mean * direction < 0 else -1)
    return out


def _signs(
    cmp: Comparison, family: str, keys: Sequence[tuple[str, int]], scale: float = 1.0
) -> dict[str, list[int | None]]:
    """Per baseline, :func:`signs_of` its differences to Hypersolid in ``family``."""
    return {m: signs_of(diffs, keys, scale) for m, diffs in cmp.diffs[family].items()}


def margins(cmp: Comparison, claim: Claim) -> dict[str, dict[str, MarginTest]]:
    """A parity claim's margin tests, per baseline and metric (Holm over the claim's metrics)."""
    keys = {k for k, _, _ in claim.metrics}
    ref = {k: v for k, v in cmp.values.get(REFERENCE, {}).items() if k in keys}
    return {
        m: margin_tests({k: v for k, v in cmp.values[m].items() if k in keys}, ref, claim.margin)
        for m in cmp.methods
        if m != REFERENCE
    }


def _margin_signs(
    tests: dict[str, dict[str, MarginTest]], keys: Sequence[tuple[str, int]], scale: float = 1.0
) -> dict[str, list[int | None]]:
    """Per baseline, one sign per metric of a parity claim: +1 the baseline shown ahead by less than the margin
    (or behind), -1 shown ahead by more, 0 neither, None not tested."""
    out: dict[str, list[int | None]] = {}
    for m, per in tests.items():
        signs: list[int | None] = []
        for key, _ in keys:
            t = per.get(key)
            if t is None:
                signs.append(None)
            elif t.p_beyond_holm * scale < LEVEL:
                signs.append(-1)
            else:
                signs.append(1 if t.p_within_holm * scale < LEVEL else 0)
        out[m] = signs
    return out


def _verdict(signs: dict[str, list[int | None]], parity: bool = False) -> str:
    if not signs or all(x is None for s in signs.values() for x in s):
        return "not testable here"
    if any(-1 in s for s in signs.values()):
        return "does not hold here"
    # Parity needs every baseline shown within the margin on every metric tested (and tested on one);
    # superiority needs every baseline beaten on some metric.
    if all(
        (any(x is not None for x in s) and all(x in (1, None) for x in s)) if parity else 1 in s for s in signs.values()
    ):
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
        elif bits and len(bits) < len(tested):  # the family's other metrics too: what did not carry the verdict
            bits += [
                f"not significant: {labels[key]} {fmt_interval(d.diff, signed=True)}, p {d.p_holm:.2g}"
                for key, d in tested
                if d.p_holm >= LEVEL
            ]
        said = "; ".join(bits) if bits else "fewer than two paired seeds"
        parts.append(f"{METHOD_NAMES[m]} − Hypersolid: {said}")
    return " · ".join(parts)


def _margin_evidence(tests: dict[str, dict[str, MarginTest]], keys: Sequence[str], labels: dict[str, str]) -> str:
    parts = []
    for m, per in tests.items():
        bits = []
        for key in keys:
            t = per.get(key)
            if t is None:
                continue
            if t.p_beyond_holm < LEVEL:
                said = f"ahead by more than the ±{t.delta:g} margin, p {t.p_beyond_holm:.2g}"
            elif t.p_within_holm < LEVEL:
                said = f"within the ±{t.delta:g} margin or behind, p {t.p_within_holm:.2g}"
            else:
                said = f"neither shown (within p {t.p_within_holm:.2g}, beyond p {t.p_beyond_holm:.2g})"
            bits.append(f"{labels[key]} {fmt_interval(t.diff, signed=True)}: {said}")
        parts.append(f"{METHOD_NAMES[m]} − Hypersolid: {'; '.join(bits) or 'fewer than two paired seeds'}")
    return " · ".join(parts)


@dataclass(frozen=True)
class Scope:
    """One budget and tuning at which the claims are judged: ``label`` names them in every verdict
    ("after 1 epoch, each method's untuned defaults"); ``cmp`` is None until its runs exist."""

    key: str
    label: str
    cmp: Comparison | None
    missing: str = "its runs have not been done"


def judge(claim: Claim, scope: Scope, n_claims: int = 1) -> dict[str, str]:
    """The verdict on one claim at one scope, its evidence, the verdict with its scope in words, and the
    family-wise verdict over ``n_claims`` Holm families judged at the scope (Bonferroni)."""
    cmp = scope.cmp
    keys = [(k, d) for k, _, d in claim.metrics]
    basis, familywise = "", ""
    if cmp is None or len(cmp.methods) < 2 or REFERENCE not in cmp.methods:
        verdict, evidence = "not testable here", scope.missing
    elif all(not any(k in cmp.values[m] for k, _ in keys) for m in cmp.methods):
        verdict, evidence = (
            "not testable here",
            "not measured in these runs' evaluations (a metric added to the protocol later)",
        )
    else:
        labels = {k: label for k, label, _ in claim.metrics}
        if claim.parity:
            tests = margins(cmp, claim)
            signs = _margin_signs(tests, keys)
            familywise = _verdict(_margin_signs(tests, keys, n_claims), True)
            evidence = _margin_evidence(tests, [k for k, _ in keys], labels)
        else:
            signs = _signs(cmp, claim.family, keys)
            familywise = _verdict(_signs(cmp, claim.family, keys, n_claims))
            evidence = _evidence(cmp, claim.family, keys, labels)
        verdict = _verdict(signs, claim.parity)
        basis = _basis(signs, [labels[k] for k, _ in keys], verdict)
    return {
        "claim": claim.name,
        "family": FAMILY_NAMES[claim.family],
        "paper": claim.paper,
        "scope": scope.label,
        "short": scope.key,
        "verdict": verdict,
        "familywise": familywise or verdict,
        "scoped": f"{verdict.removesuffix(' here')} {scope.label}",
        "evidence": evidence,
        "basis": basis,
    }


def _basis(signs: dict[str, list[int | None]], labels: Sequence[str], verdict: str) -> str:
    """Which of a claim's metrics decided a verdict, when only some did ("" otherwise): a claim judged on
    several metrics (the peak ratio and the absolute gap; kNN and the linear probe) can hold on one while the
    other shows no difference, and the summary says so rather than let the verdict speak for both."""
    decisive = {"holds here": 1, "does not hold here": -1}.get(verdict)
    tested = [i for i in range(len(labels)) if any(s[i] is not None for s in signs.values())]
    if decisive is None or len(tested) < 2:
        return ""
    status = {i: {s[i] for s in signs.values()} for i in tested}
    by = [labels[i] for i in tested if decisive in status[i]]
    if not by or len(by) == len(tested):  # a parity claim holds on no difference: nothing decided it
        return ""
    # A claim that does not hold may still win on another metric (one that holds loses on none, by its rule).
    won = [labels[i] for i in tested if decisive == -1 and 1 in status[i] and -1 not in status[i]]
    silent = [labels[i] for i in tested if labels[i] not in by and labels[i] not in won]
    said = [f"{'against it on' if decisive == -1 else 'on'} {' and '.join(by)}"]
    said += [f"for it on {' and '.join(won)}"] if won else []
    said += [f"not significant on {' and '.join(silent)}"] if silent else []
    return "; ".join(said)


def verdicts(scopes: Sequence[Scope]) -> list[dict[str, str]]:
    """One row per claim of the paper and scope (budget and tuning), with the family-wise verdict beside each;
    the claims about Hypersolid's own settings are ablations.py's."""
    rows = []
    for sc in scopes:
        # The family-wise factor: the Holm families of the claims that can be judged at this scope (a family shared
        # by several claims, geometry, is already corrected within; a claim not tested there adds no test).
        n = len({c.family for c in CLAIMS if judge(c, sc)["verdict"] != "not testable here"})
        rows += [judge(c, sc, max(1, n)) for c in CLAIMS]
    return rows
