"""The paper's claims about Hypersolid's own settings (amendment 3 of docs/replication.md): the weak L2 term
(part ``l2`` against the λ = 1e-6 runs of part ``long``) and the global batch (part ``batch``, two arms). Each is
judged by judging.py's rule between arms of Hypersolid, paired by seed, Holm over the claim's comparisons.

* **L2**: λ = 1e-6 against λ = 0 after 20 epochs, at the tuned α; anisotropy (lower with the L2 term) and
  sparsity (higher) one family: holds when λ = 1e-6 is better on one and worse on neither.
* **Batch**: in each arm (equal epochs: 2 epochs at 64, 128 and 256; equal steps: 1, 2 and 4 epochs), kNN@5
  (majority vote, backbone raw) of batch 128 against 64 and against 256, one family per arm: holds when 128 is
  above both, does not hold when another size is above it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from benchmarks.replication.claims import BB
from benchmarks.replication.formatting import fmt_interval
from benchmarks.replication.judging import _verdict, by_seed, signs_of
from benchmarks.replication.plan import BATCH_EPOCHS, BATCH_SIZES, L2_OFF, LONG_EPOCHS
from benchmarks.replication.sections import _at_epoch
from benchmarks.replication.stats import paired_differences, t_interval

SCOPE = "Hypersolid's own settings"  # the rows' short scope (their verdict column)
L2_CLAIM = "The weak L2 term lowers anisotropy and raises sparsity"
L2_METRICS = ((f"{BB}geometry.anisotropy", "anisotropy", -1), (f"{BB}geometry.sparsity", "sparsity", +1))
BATCH_CLAIM = "Batch 128 is the best global batch"
BATCH_METRIC = f"{BB}knn_k5_majority"
ARMS = {
    "equal epochs": dict.fromkeys(BATCH_SIZES, BATCH_EPOCHS),
    "equal steps": {b: BATCH_EPOCHS * b // 128 for b in BATCH_SIZES},
}


def _row(claim: str, family: str, paper: str, scope: str, verdict: str, evidence: str) -> dict[str, str]:
    return {
        "claim": claim,
        "family": family,
        "paper": paper,
        "scope": scope,
        "short": SCOPE,
        "verdict": verdict,
        "familywise": verdict,  # one family each: no correction across claims
        "scoped": f"{verdict.removesuffix(' here')} {scope}",
        "evidence": evidence,
        "basis": "",
    }


def l2_row(long_runs: Sequence[dict[str, Any]], l2_runs: Sequence[dict[str, Any]], alpha: float | None) -> dict:
    """The L2 claim from the λ = 1e-6 runs of part long (Hypersolid at ``alpha``) and part l2's λ = 0 runs."""
    paper = "Hypersolid λ 1e-6 (part long) against λ 0 (part l2), α tuned, 20 epochs, paired by seed"
    scope = f"after {LONG_EPOCHS} epochs, Hypersolid α {alpha if alpha is None else f'{alpha:g}'}, λ 1e-6 vs λ 0"
    on = [
        r
        for r in long_runs
        if r["method"] == "hypersolid"
        and alpha is not None
        and r["overrides"][:1] == [f"method.hypersolid.alpha={alpha}"]
    ]
    off = [r for r in l2_runs if L2_OFF in r["overrides"]]
    entry = _at_epoch(LONG_EPOCHS)
    keys = {k for k, _, _ in L2_METRICS}
    ref = {k: v for k, v in by_seed(on, "hypersolid", entry).items() if k in keys}
    other = {k: v for k, v in by_seed(off, "hypersolid", entry).items() if k in keys}
    diffs = paired_differences(other, ref)
    if not diffs:
        return _row(L2_CLAIM, "L2", paper, scope, "not testable here", f"part l2: {len(off)} of 3 seeds done")
    verdict = _verdict({"λ 0": signs_of(diffs, [(k, d) for k, _, d in L2_METRICS])})
    said = "; ".join(
        f"{label} {fmt_interval(diffs[k].diff, signed=True)}, p {diffs[k].p_holm:.2g}"
        for k, label, _ in L2_METRICS
        if k in diffs
    )
    return _row(L2_CLAIM, "L2", paper, scope, verdict, f"λ 0 − λ 1e-6: {said}")


def _batch_of(run: dict[str, Any]) -> int | None:
    sizes = [o.split("=", 1)[1] for o in run["overrides"] if o.startswith("data.global_batch_size=")]
    return int(sizes[0]) if sizes else None


def _arm_runs(batch_runs: Sequence[dict[str, Any]], epochs: dict[int, int]) -> dict[int, list[dict[str, Any]]]:
    """One arm's runs by global batch: those of each size trained for that size's epochs."""
    return {b: [r for r in batch_runs if _batch_of(r) == b and r["epochs"] == e] for b, e in epochs.items()}


def batch_rows(batch_runs: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    """The batch claim in each arm: 128 against the other sizes on kNN@5, paired by seed."""
    rows = []
    for arm, epochs in ARMS.items():
        claim = f"{BATCH_CLAIM} ({arm})"
        scope = f"at {arm}: " + ", ".join(f"{b} × {e} epoch{'s' * (e > 1)}" for b, e in epochs.items())
        paper = "global batch 64 / 128 / 256, square-root learning-rate scaling from 128, 3 seeds (part batch)"
        arm_runs = _arm_runs(batch_runs, epochs)
        ref = by_seed(arm_runs[128], "hypersolid").get(BATCH_METRIC, {})
        others = {f"batch {b}": by_seed(arm_runs[b], "hypersolid").get(BATCH_METRIC, {}) for b in epochs if b != 128}
        # One family per arm: the two comparisons with 128, Holm over them (keyed by the other size).
        diffs = paired_differences(others, dict.fromkeys(others, ref))
        if len(diffs) < len(others):
            done = {b: len(rs) for b, rs in arm_runs.items()}
            rows.append(_row(claim, f"batch, {arm}", paper, scope, "not testable here", f"seeds done per size: {done}"))
            continue
        verdict = _verdict({name: signs_of({BATCH_METRIC: d}, [(BATCH_METRIC, 1)]) for name, d in diffs.items()})
        said = "; ".join(
            f"{name} − batch 128: kNN@5 {fmt_interval(d.diff, signed=True)}, p {d.p_holm:.2g}"
            for name, d in diffs.items()
        )
        rows.append(_row(claim, f"batch, {arm}", paper, scope, verdict, said))
    return rows


def batch_table(batch_runs: Sequence[dict[str, Any]]) -> list[str]:
    """Each arm's sizes with the numbers its verdict compares: steps, seeds and kNN@5 (mean [95 % interval])."""
    lines = [
        "| arm | global batch | epochs | steps | seeds | kNN@5 (majority, backbone raw) |",
        "|---|---|---|---|---|---|",
    ]
    for arm, epochs in ARMS.items():
        for b, runs in _arm_runs(batch_runs, epochs).items():
            e = epochs[b]
            knn = list(by_seed(runs, "hypersolid").get(BATCH_METRIC, {}).values())
            steps = sorted({r["final_step"] for r in runs if "final_step" in r})
            cell = fmt_interval(t_interval(knn)) if knn else "not run yet"
            lines.append(f"| {arm} | {b} | {e} | {', '.join(map(str, steps)) or '–'} | {len(runs)} | {cell} |")
    return lines


def ablation_rows(runs: Sequence[dict[str, Any]], alpha: float | None) -> list[dict[str, str]]:
    """Both claims' rows from the cpu group's results (``alpha``: the tuned α the 20-epoch runs trained)."""
    part = {p: [r for r in runs if r["part"] == p] for p in ("long", "l2", "batch")}
    return [l2_row(part["long"], part["l2"], alpha), *batch_rows(part["batch"])]
