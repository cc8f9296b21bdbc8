"""The report's 20-epoch part (plan part ``long``, amendment 2 of docs/replication.md): the learning curves of
Hypersolid and SimCLR at their tuned values over the widened grid, with the training's own loss terms, and the
scopes at which the claims are judged from these runs (after 5 and after 20 epochs: the same runs, so the two
verdict columns differ only in the budget).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.replication.claims import METHOD_NAMES
from benchmarks.replication.judging import Scope, compare
from benchmarks.replication.plan import CPU_TUNE, LONG_BASELINES, LONG_EPOCHS, LONG_EVAL_EPOCHS, LONG_SEEDS
from benchmarks.replication.sections import (
    CURVE_METRICS,
    DATASET,
    IMAGES_PER_EPOCH,
    STEPS_PER_EPOCH,
    _at_epoch,
    _setting,
    budget_label,
    epoch_row,
    views_of,
)

# The training's epoch means beside each evaluation (run.py: ``train.<statistic>`` from epochs.jsonl); the
# baselines report their loss only, so their cells read "–".
TRAIN_TERMS = (
    ("train.loss", "loss (train)"),
    ("train.alignment", "alignment (train)"),
    ("train.repulsion", "repulsion (train)"),
    ("train.active_fraction", "active-pair share (train)"),
)
LONG_METRICS = (*CURVE_METRICS, *TRAIN_TERMS)
LONG_METHODS = ("hypersolid", "simclr")


def _mine(runs: Sequence[dict[str, Any]], method: str, value: float | None) -> list[dict[str, Any]]:
    return [r for r in runs if r["method"] == method and value is not None and float(_setting(r)) == value]


def long_scopes(runs: Sequence[dict[str, Any]], tuned_values: dict[str, float | None]) -> list[Scope]:
    """The claims judged after 5 and after 20 epochs of the 20-epoch runs (Hypersolid against SimCLR, both at the
    widened grid's choice, paired by seed)."""
    hyp, sim = (tuned_values.get(m) for m in LONG_METHODS)
    # Amendment 3's baselines at their defaults join the comparison once they have runs.
    pair = [*_mine(runs, "hypersolid", hyp), *_mine(runs, "simclr", sim)]
    pair += [r for r in runs if r["method"] in LONG_BASELINES and _setting(r) == "default"]
    have = {r["method"] for r in pair}
    waiting = hyp is None or sim is None
    out = []
    for epoch in (5, LONG_EPOCHS):
        at = [r for r in pair if _at_epoch(epoch)(r) is not None]
        ready = set(LONG_METHODS) <= {r["method"] for r in at}
        extra = [METHOD_NAMES[m] for m in LONG_BASELINES if any(r["method"] == m for r in at)]
        label = (
            f"after {epoch} epochs of the {LONG_EPOCHS}-epoch runs, Hypersolid α {hyp:g} vs SimCLR temperature "
            f"{sim:g} (both tuned on the widened grid)"
            + (f" and {' and '.join(extra)} at their defaults" if extra else "")
            if not waiting
            else f"after {epoch} epochs of the {LONG_EPOCHS}-epoch runs, both tuned on the widened grid"
        )
        missing = "waits for the widened tuning" if waiting else f"its runs have not been done ({sorted(have)} so far)"
        out.append(
            Scope(
                f"{epoch} of {LONG_EPOCHS} epochs, widened tuning",
                label,
                compare(at, entry=_at_epoch(epoch)) if ready else None,
                missing,
            )
        )
    return out


def long_lines(
    runs: Sequence[dict[str, Any]], tuned_values: dict[str, float | None], figs: dict[str, Path], link: Any
) -> list[str]:
    """The part's section: its scope, one row per setting and evaluated epoch (mean [95 % interval] over seeds)
    of the curve metrics and the training's loss terms, and the curves' figure (``link(path)``: its
    relative link)."""
    out = [
        f"### CPU group: {LONG_EPOCHS} epochs, learning curves and the loss's own terms",
        "",
        (
            f"Scope: {DATASET}; budget: {LONG_EPOCHS} epochs ({LONG_EPOCHS * IMAGES_PER_EPOCH:,} images seen), the "
            f"protocol after epochs {', '.join(map(str, LONG_EVAL_EPOCHS))}; {LONG_SEEDS} seeds per setting; "
            f"views: {views_of(list(LONG_METHODS))}; tuning: the widened grid's choice (held-out kNN@5, 1 epoch, "
            "2 seeds per value). The training columns are the epoch's means over its steps (the trainer's "
            "epochs.jsonl): alignment and repulsion are Hypersolid's terms, the active-pair share the fraction of "
            "pairs inside the exclusion zone. Mean [95 % t-interval] (n seeds)."
        ),
        "",
    ]
    rows = []
    for m in LONG_METHODS:
        v = tuned_values.get(m)
        if v is None:
            knob = CPU_TUNE[m][0].rsplit(".", 1)[1]
            out.append(f"* {METHOD_NAMES[m]} at its tuned {knob}: waits for the widened tuning ({LONG_SEEDS} runs).")
            continue
        rs = _mine(runs, m, v)
        out.append(f"* {budget_label(m, v, v)}: {len(rs)} of {LONG_SEEDS} seeds done.")
        rows += [epoch_row(budget_label(m, v, v), rs, e, LONG_METRICS) for e in LONG_EVAL_EPOCHS]
    for m in LONG_BASELINES:  # amendment 3: at their defaults
        rs = [r for r in runs if r["method"] == m and _setting(r) == "default"]
        out.append(f"* {METHOD_NAMES[m]} at its defaults (amendment 3): {len(rs)} of {LONG_SEEDS} seeds done.")
        rows += [epoch_row(f"{METHOD_NAMES[m]} (defaults)", rs, e, LONG_METRICS) for e in LONG_EVAL_EPOCHS if rs]
    if rows:
        out += ["", "| setting | epoch | " + " | ".join(lb for _, lb in LONG_METRICS) + " |"]
        out += ["|---|---|" + "---|" * len(LONG_METRICS), *rows]
        out += _partial_epochs([r for m in LONG_METHODS for r in _mine(runs, m, tuned_values.get(m))])
    out += ["", *(f"![{name}]({link(path)})" for name, path in figs.items()), ""]
    return out


def _partial_epochs(runs: Sequence[dict[str, Any]]) -> list[str]:
    """A note for each evaluated epoch whose training means cover fewer than its steps: a run killed mid-epoch
    before the trainer recorded the epoch so far beside each checkpoint resumed with that epoch's first part
    unrecorded (its evaluation is unaffected: the resumed run trained every step)."""
    short = [
        f"{r['run']} epoch {t['epoch']}: {t['steps']} of {STEPS_PER_EPOCH}"
        for r in sorted(runs, key=lambda r: r["run"])
        for t in r.get("train_per_epoch", [])
        if t["epoch"] in LONG_EVAL_EPOCHS and t["steps"] < STEPS_PER_EPOCH
    ]
    if not short:
        return []
    return [
        "",
        "Training columns over part of an epoch (steps recorded): "
        + "; ".join(short)
        + ". The run was killed mid-epoch and resumed from a later checkpoint of that epoch, before the trainer "
        "recorded the epoch so far beside each checkpoint; the epoch's first steps were trained but not recorded, "
        "and its evaluation is unaffected.",
    ]
