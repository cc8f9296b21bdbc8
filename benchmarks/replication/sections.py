"""The report's section builders for the scopes the replication study added: scope lines, the tuning table,
the 5-epoch budget, Hypersolid on two views and the planned/done/left table (report.py assembles them).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from benchmarks.replication.claims import (
    BB,
    DBSCAN_BEST,
    GEOMETRY,
    HDBSCAN_CLUSTERS,
    HEADLINE,
    INTERP,
    INTERP_RATIO,
    METHOD_NAMES,
    REFERENCE,
    SELECTIVITY,
    methods_in,
)
from benchmarks.replication.judging import compare
from benchmarks.replication.plan import (
    BUDGET_EPOCHS,
    BUDGET_EVAL_EPOCHS,
    BUDGET_SEEDS,
    CPU_DEFAULTS,
    CPU_TUNE,
    FIRST_TUNE,
    LONG_EPOCHS,
    LONG_EVAL_EPOCHS,
    LONG_SEEDS,
    RANDOM_SEEDS,
    TUNE_SEEDS,
    VIEW_REASONS,
    VIEWS,
    VIEWS_SEEDS,
    budget_settings,
    long_runs,
    plan,
    tune_runs,
)
from benchmarks.replication.tables import (
    _cell,
    diff_table,
    means_table,
)

OTHER_METRICS = (
    *((k, label) for k, label, _, _ in SELECTIVITY),
    (INTERP_RATIO, "interpolation peak ratio, different / same class"),
    (INTERP, "interpolation gap"),
    (DBSCAN_BEST, "best DBSCAN NMI over the eps grid"),
    *HDBSCAN_CLUSTERS,
)
DATASET = "Fashion-MNIST (10 classes), the quickstart's 4-block CNN at 28 px, global batch 128"
STEPS_PER_EPOCH = 468  # 60,000 training images at a global batch of 128 (the loader drops the last partial batch)
IMAGES_PER_EPOCH = STEPS_PER_EPOCH * 128  # 59,904 images seen per epoch


NAMES = {**METHOD_NAMES, "hypersolid2v": "Hypersolid (2 views)"}


def views_of(methods: Sequence[str]) -> str:
    """ "Hypersolid 2 + 4, SimCLR 2, ... views": the views each method trained on."""
    return ", ".join(f"{NAMES[m]} {VIEWS[m]}" for m in methods) + " views" if methods else "none run"


def view_reasons(methods: Sequence[str]) -> str:
    return "; ".join(f"{NAMES[m]} {VIEWS[m]} ({VIEW_REASONS[m]})" for m in methods)


def seeds_of(runs: Sequence[dict[str, Any]]) -> str:
    return ", ".join(
        f"{METHOD_NAMES[m]} {len({r['seed'] for r in runs if r['method'] == m})}" for m in methods_in(runs)
    )


def cpu_scope(runs: Sequence[dict[str, Any]], floor: Sequence[dict[str, Any]]) -> str:
    return (
        f"{DATASET}; budget: 1 epoch ({STEPS_PER_EPOCH} steps, {IMAGES_PER_EPOCH:,} images seen per method); "
        "tuning: none, "
        f"each method's defaults; views: {views_of(methods_in(runs))} (the same images seen, not the same views: "
        "each method keeps its paper's views, and Hypersolid also runs on 2 views below); "
        f"seeds: {seeds_of(runs)}; random init: {len(floor)} of {RANDOM_SEEDS} seeds; one process on a 2-core CPU"
    )


def _at_epoch(epoch: int) -> Any:
    return lambda r: next((e for e in r["per_epoch"] if e["epoch"] == epoch), None)


def _setting(r: dict[str, Any]) -> str:
    return r["overrides"][0].split("=", 1)[1] if r["overrides"] else "default"


def budget_label(method: str, value: float, tuned_value: float | None) -> str:
    knob = "α" if method == "hypersolid" else "temperature"
    tag = " (tuned)" if tuned_value == value else ""
    if method == "hypersolid" and value == CPU_DEFAULTS["hypersolid"]:
        tag = " (the paper's" + (", also the tuned one)" if tuned_value == value else ")")
    return f"{METHOD_NAMES[method]} {knob} {value:g}{tag}"


def tuning_lines(
    tune: Sequence[dict[str, Any]], tuned_values: dict[str, float | None], first_tuned: dict[str, float | None]
) -> list[str]:
    done = {r["run"]: r for r in tune}
    planned = tune_runs()
    out = [
        "### CPU group: equal tuning on the held-out split",
        "",
        (
            f"Scope: {DATASET}; 1 epoch; one knob per method, {TUNE_SEEDS} seeds per value (the first grid of 3 "
            "values, widened by amendment 2 to bracket its optimum); evaluated "
            "with the protocol on the held-out 10 % of the training split (`data.eval_split=holdout`, the test "
            "split is not read; the unlabelled training images include the held-out ones, as the training split "
            f"is what the methods train on); the value with the highest mean held-out kNN@5 is chosen. Views: "
            f"{views_of(list(CPU_TUNE))}. {sum(r.name in done for r in planned)} of {len(planned)} runs done."
        ),
        "",
        "| method | value | seeds done | held-out kNN@5 (%) | held-out linear (%) | held-out K-Means AMI | chosen |",
        "|---|---|---|---|---|---|---|",
    ]
    for m, (key, values) in CPU_TUNE.items():
        for v in values:
            rs = [done[r.name] for r in planned if r.method == m and r.overrides[0] == f"{key}={v}" and r.name in done]
            n = len([r for r in planned if r.method == m and r.overrides[0] == f"{key}={v}"])
            cells = [_cell({r["seed"]: r["final"][k] for r in rs if k in r["final"]}) for k in TUNE_KEYS]
            chosen = "**chosen**" if tuned_values.get(m) == v else ("–" if tuned_values.get(m) is not None else "")
            if first_tuned.get(m) == v and v in FIRST_TUNE[m] and tuned_values.get(m) != v:
                chosen = "chosen from the first grid (the 5-epoch runs)"
            knob = key.rsplit(".", 1)[1]
            out.append(
                f"| {METHOD_NAMES[m]} | {knob} {v:g} | {len(rs)} of {n} | " + " | ".join(cells) + f" | {chosen} |"
            )
    out += [
        "",
        (
            "Until every value of a grid has its seeds, nothing is chosen from it: the 5-epoch runs took the first "
            "grid's choice, the 20-epoch runs wait for the widened grid's. The choice rests on 1 epoch and 2 seeds "
            "per value. No random-init row: the floor is measured on the test split only (the other tables)."
        ),
        "",
    ]
    return out


TUNE_KEYS = (f"{BB}knn_k5_majority", f"{BB}linear_top1", f"{BB}kmeans.ami")
CURVE_METRICS = (
    (f"{BB}knn_k5_majority", "kNN@5 (%)"),
    (f"{BB}linear_top1", "linear (%)"),
    (f"{BB}kmeans.ami", "K-Means AMI"),
    (f"{BB}hdbscan_mcs10.ami", "HDBSCAN AMI mcs 10"),
    (f"{BB}geometry.anisotropy", "anisotropy"),
    (f"{BB}geometry.sparsity", "sparsity"),
    ("protocol.exclusion.same_class_frac", "same-class in zone"),
)


def epoch_row(label: str, runs: Sequence[dict[str, Any]], epoch: int, metrics: Sequence[tuple[str, str]]) -> str:
    """One table row: the runs' evaluation after ``epoch``, mean [95 % interval] over seeds per metric ("–" for a
    metric the runs lack, "not run" when there are no runs)."""
    cells = [
        _cell({r["seed"]: x[k] for r in runs if (x := _at_epoch(epoch)(r)) and k in x}, "–" if runs else "not run")
        for k, _ in metrics
    ]
    return f"| {label} | {epoch} | " + " | ".join(cells) + " |"


def budget_lines(
    budget: Sequence[dict[str, Any]],
    settings: Sequence[tuple[str, float | None]],
    tuned_values: dict[str, Any],
    floor: Sequence[dict[str, Any]] = (),
) -> list[str]:
    out = [
        f"### CPU group: {BUDGET_EPOCHS} epochs, learning curves",
        "",
        (
            f"Scope: {DATASET}; budget: {BUDGET_EPOCHS} epochs ({BUDGET_EPOCHS * IMAGES_PER_EPOCH:,} images seen), the "
            f"protocol after epochs {', '.join(map(str, BUDGET_EVAL_EPOCHS))}; {BUDGET_SEEDS} seeds per setting; "
            f"views: {views_of(['hypersolid', 'simclr'])}. Mean [95 % t-interval] (n seeds) per epoch."
        ),
        "",
    ]
    rows = []
    for m, v in settings:
        if v is None:
            out.append(f"* {METHOD_NAMES[m]} at its tuned value: waits for the tuning ({BUDGET_SEEDS} runs, not run).")
            continue
        rs = [r for r in budget if r["method"] == m and float(_setting(r)) == v]
        label = budget_label(m, v, tuned_values.get(m))
        out.append(f"* {label}: {len(rs)} of {BUDGET_SEEDS} seeds done.")
        rows += [epoch_row(label, rs, e, CURVE_METRICS) for e in BUDGET_EVAL_EPOCHS]
    cells = [
        _cell({r["seed"]: r["final"][k] for r in floor if k in r["final"]}, "–" if floor else "not run")
        for k, _ in CURVE_METRICS
    ]
    rows.append("| random init (the initial weights) | 0 | " + " | ".join(cells) + " |")
    out += ["", "| setting | epoch | " + " | ".join(lb for _, lb in CURVE_METRICS) + " |"]
    out += ["|---|---|" + "---|" * len(CURVE_METRICS), *rows, ""]
    return out


def views_lines(views: Sequence[dict[str, Any]], cpu: Sequence[dict[str, Any]]) -> list[str]:
    out = [
        "### CPU group: equal footing, Hypersolid on 2 views",
        "",
        (
            f"Scope: {DATASET}; 1 epoch, defaults; Hypersolid on 2 views against Hypersolid on 2 + 4 views, the "
            f"same images seen, paired by seed; {len(views)} of {VIEWS_SEEDS} seeds done. Its verdicts against the "
            'baselines are the scope "after 1 epoch, untuned defaults, Hypersolid on 2 views" above. Why each '
            f"method has its views: {view_reasons(['hypersolid', 'hypersolid2v', 'simclr', 'swav', 'barlowtwins'])}."
        ),
        "",
    ]
    if not views:
        return [*out, "Not run yet.", ""]
    pair = [*[{**r, "method": "simclr"} for r in views], *[r for r in cpu if r["method"] == REFERENCE]]
    cmp = compare(pair)
    names = {"hypersolid": "Hypersolid, 2 + 4 views", "simclr": "Hypersolid, 2 views"}
    metrics = (*HEADLINE, *GEOMETRY)
    return [*out, *means_table(cmp, metrics, names=names), "", *diff_table(cmp, metrics, names=names), ""]


def plan_lines(cpu_all: Sequence[dict[str, Any]], results: dict[str, dict[str, Any]]) -> list[str]:
    """Every part of the cpu group: planned, done, left (what a rerun of cpu.sh runs next, in this order)."""
    planned = plan("cpu", results=results)
    done = {r["run"] for r in cpu_all}
    waiting = sum(BUDGET_SEEDS for _, v in budget_settings(results) if v is None)
    # The cost of what is left, from the first pass's measured medians (one process on this 2-core CPU): a run
    # paused while it ran (its wall time counts the pause) moves a median less than a mean.
    first = [r for r in cpu_all if r["part"] == "cpu"]
    train = statistics.median([r["train_s_total"] or r["train_s"] for r in first]) if first else 0.0
    evals = statistics.median([r["eval_s"] for r in first]) if first else 0.0

    def cost(r: Any) -> float:
        return (30.0 if r.random_init else r.epochs * train) + evals * max(1, len(r.eval_epochs))

    left = [r for r in planned if r.name not in done]
    # The 20-epoch part joins the plan once the widened tuning is complete: until then, counted as waiting.
    waiting_long = 0 if long_runs(results) else 2 * LONG_SEEDS
    long_cost = LONG_EPOCHS * train + evals * len(LONG_EVAL_EPOCHS)
    budget_cost = cost(next(r for r in planned if r.part == "budget"))
    hours = (sum(cost(r) for r in left) + waiting * budget_cost + waiting_long * long_cost) / 3600
    out = [
        "### CPU group: what is planned, done and left",
        "",
        (
            "`bash benchmarks/replication/cpu.sh` runs what is left in this order and skips what is done (a stopped "
            f"run resumes from its last 100-step checkpoint). Estimated time left: {hours:.1f} h of one process on "
            f"this 2-core CPU ({train / 60:.1f} min per training epoch and {evals / 60:.1f} min per evaluation, the "
            "first pass's medians)."
        ),
        "",
        "| part | planned | done | not run |",
        "|---|---|---|---|",
    ]
    for part in dict.fromkeys(r.part for r in planned):
        names = [r.name for r in planned if r.part == part]
        n_done = sum(n in done for n in names)
        extra = f" (+ {waiting} waiting for the tuning)" if part == "budget" and waiting else ""
        out.append(f"| {part} | {len(names)}{extra} | {n_done} | {len(names) - n_done}{extra} |")
    if waiting_long:
        out.append(f"| long | {waiting_long} waiting for the tuning | 0 | {waiting_long} |")
    return [*out, ""]
