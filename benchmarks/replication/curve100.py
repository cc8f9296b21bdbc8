"""The report's 100-epoch part (plan part ``curve100``, amendment 3 of docs/replication.md): Hypersolid and SimCLR
at their tuned values, 3 seeds, the protocol after epochs 20, 50 and 100, trained in two stages (every run to 50
first). Its rows and the scopes at which the claims are judged from it (after 50 and after 100 epochs), each as
soon as both methods have two seeds evaluated there; and its epoch 20 against the 20-epoch runs of part ``long``
(the same settings and seeds: amendment 4 diagnoses these weights in their stead).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from benchmarks.replication.judging import Scope, compare, equal_metrics
from benchmarks.replication.long_run import LONG_METHODS, LONG_METRICS, _mine
from benchmarks.replication.plan import CURVE100_EPOCHS, CURVE100_EVAL_EPOCHS, CURVE100_SEEDS, LONG_EPOCHS
from benchmarks.replication.sections import DATASET, IMAGES_PER_EPOCH, _at_epoch, budget_label, epoch_row, views_of

JUDGED_AT = (50, CURVE100_EPOCHS)


def curve100_scopes(runs: Sequence[dict[str, Any]], tuned_values: dict[str, float | None]) -> list[Scope]:
    hyp, sim = (tuned_values.get(m) for m in LONG_METHODS)
    pair = [*_mine(runs, "hypersolid", hyp), *_mine(runs, "simclr", sim)]
    out = []
    for epoch in JUDGED_AT:
        at = [r for r in pair if _at_epoch(epoch)(r) is not None]
        counts = {m: sum(r["method"] == m for r in at) for m in LONG_METHODS}
        ready = all(n >= 2 for n in counts.values())
        label = (
            f"after {epoch} epochs of the {CURVE100_EPOCHS}-epoch runs, Hypersolid α {hyp} vs SimCLR temperature "
            f"{sim} (both tuned on the widened grid)"
        )
        out.append(
            Scope(
                f"{epoch} of {CURVE100_EPOCHS} epochs",
                label,
                compare(at, entry=_at_epoch(epoch)) if ready else None,
                f"its runs have not reached epoch {epoch} with two seeds each ({counts} so far)",
            )
        )
    return out


def same_as_long(runs: Sequence[dict[str, Any]], long: Sequence[dict[str, Any]]) -> list[str]:
    """Each 100-epoch run's epoch-20 evaluation against the 20-epoch run of its method, settings and seed (part
    ``long``): "<run> equals <long run>'s epoch 20 on N of M metrics" (M: the 20-epoch run's protocol metrics)."""
    said = []
    at = _at_epoch(LONG_EPOCHS)
    for r in runs:
        key = (r["method"], r["seed"], r["overrides"])
        for twin in (t for t in long if (t["method"], t["seed"], t["overrides"]) == key):
            ours, theirs = at(r), at(twin)
            if ours is None or theirs is None:
                continue
            said.append(f"{r['run']} equals {twin['run']}'s epoch {LONG_EPOCHS} {equal_metrics(ours, theirs)}")
    return said


def curve100_lines(
    runs: Sequence[dict[str, Any]], tuned_values: dict[str, float | None], long: Sequence[dict[str, Any]] = ()
) -> list[str]:
    """The part's section: what has run (seeds at each evaluated epoch), each run's epoch 20 against part ``long``'s
    run of its settings and seed, and one row per method and epoch."""
    out = [
        f"### CPU group: {CURVE100_EPOCHS} epochs",
        "",
        (
            f"Scope: {DATASET}; budget: {CURVE100_EPOCHS} epochs ({CURVE100_EPOCHS * IMAGES_PER_EPOCH:,} images "
            f"seen), the protocol after epochs {', '.join(map(str, CURVE100_EVAL_EPOCHS))}; {CURVE100_SEEDS} seeds "
            f"per method; views: {views_of(list(LONG_METHODS))}; trained in two stages (every run to epoch 50, "
            "then on to 100; a run paused at 50 is resumed from its checkpoint, bit-identically at the thread "
            "count it trained at: each result's `threads`). "
            "Mean [95 % t-interval] (n seeds)."
        ),
        "",
    ]
    rows = []
    for m in LONG_METHODS:
        v = tuned_values.get(m)
        mine = _mine(runs, m, v)
        reached = {e: sum(_at_epoch(e)(r) is not None for r in mine) for e in CURVE100_EVAL_EPOCHS}
        said = ", ".join(f"{n} at epoch {e}" for e, n in reached.items())
        out.append(f"* {budget_label(m, v, v) if v is not None else m}: {said} (of {CURVE100_SEEDS} seeds).")
        rows += [
            epoch_row(budget_label(m, v, v), mine, e, LONG_METRICS)
            for e in CURVE100_EVAL_EPOCHS
            if v is not None and reached[e]
        ]
    same = same_as_long(runs, long)
    out += [
        "",
        (
            f"Epoch {LONG_EPOCHS} against the {LONG_EPOCHS}-epoch runs of the same settings and seeds (the learning "
            f"rate is constant: on one code path and thread count the first {LONG_EPOCHS} epochs are those runs, "
            f"step for step; amendment 4 diagnoses these checkpoints in their stead, and why a pair differs is under "
            f"it): " + ("; ".join(same) if same else "no run has reached it yet") + "."
        ),
    ]
    if rows:
        out += ["", "| setting | epoch | " + " | ".join(lb for _, lb in LONG_METRICS) + " |"]
        out += ["|---|---|" + "---|" * len(LONG_METRICS), *rows]
    out.append("")
    return out
