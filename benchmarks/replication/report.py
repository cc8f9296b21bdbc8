"""The replication study's report: docs/replication.md's "Results" section, generated from the committed run
JSON (benchmarks/results/replication/<group>/<run>.json, written by run.py) and nothing else.

    python -m benchmarks.replication.report            # rewrite the Results section, the plots and summary.json
    python -m benchmarks.replication.report --check    # exit 1 if the committed section is not what the JSON gives

Everything above the "## Results" heading (the protocol, fixed before the runs) is left as it is. The
statistics are stats.py's; the verdict rules are judging.py's (the claims claims.py's), and the section's head
that states them, with the verdicts and their evidence, is verdict_section.py's; the rest of the section is
rendered here from the parts' own modules.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT
from benchmarks.replication.ablations import ablation_rows
from benchmarks.replication.claims import (
    GEOMETRY,
    HEADLINE,
    T3,
    methods_in,
)
from benchmarks.replication.curve100 import curve100_lines
from benchmarks.replication.diagnosis import diagnosis_lines
from benchmarks.replication.judging import Comparison, compare, verdicts
from benchmarks.replication.long_run import long_lines
from benchmarks.replication.plan import (
    CPU_TUNE,
    FIRST_TUNE,
    RANDOM_SEEDS,
    budget_settings,
    tuned,
)
from benchmarks.replication.readme import longest, readme_block
from benchmarks.replication.sections import (
    DATASET,
    OTHER_METRICS,
    budget_lines,
    cpu_scope,
    plan_lines,
    tuning_lines,
    views_lines,
    views_of,
)
from benchmarks.replication.tables import (
    all_metrics,
    diff_table,
    exclusion_table,
    hdbscan_table,
    means_table,
    rerun,
    run_table,
    steps_lines,
)
from benchmarks.replication.verdict_section import scopes_of, verdict_lines
from hypersolid_scale.safety import atomic

RESULTS = ROOT / "benchmarks" / "results" / "replication"
DOC = ROOT / "docs" / "replication.md"
HEADING = "## Results"


def load(group_dir: Path) -> list[dict[str, Any]]:
    """Every run result of a group (``_``-prefixed files are the driver's bookkeeping, not runs)."""
    if not group_dir.is_dir():
        return []
    return [json.loads(p.read_text()) for p in sorted(group_dir.glob("*.json")) if not p.name.startswith("_")]


def _rel(path: Path, base: Path) -> str:
    return Path(os.path.relpath(path, base)).as_posix()


def group_section(
    title: str,
    scope: str,
    runs: list[dict[str, Any]],
    cmp: Comparison | None,
    figs: dict[str, Path],
    base: Path,
    appendix: Path,
    floor: bool = False,
) -> list[str]:
    """One group's part of the Results section; ``cmp`` is ``compare(runs)`` (None when no run); ``floor``:
    the tables carry a random-init column."""
    if not runs or cmp is None:
        return [f"### {title}", "", f"Scope: {scope}.", "", "Not run yet.", ""]
    out = [f"### {title}", "", f"Scope: {scope}.", "", *run_table(runs), ""]
    out += [
        f"Every backbone metric (raw and centred), with the same tests: [{appendix.name}]({_rel(appendix, base)}).",
        "",
    ]
    out += [
        "Headline metrics (backbone, raw features): mean [95 % t-interval] over seeds.",
        "",
        *means_table(cmp, HEADLINE, floor),
        "",
    ]
    if len(cmp.methods) > 1:
        out += [
            (
                "Paired by seed, method − Hypersolid: mean difference [95 % t-interval], Holm-adjusted p within "
                "the metric's family (named in the table); * marks adjusted p < 0.05."
            ),
            "",
            *diff_table(cmp, HEADLINE),
            "",
        ]
    out += ["HDBSCAN, every setting (backbone, raw): mean AMI / NMI / ARI / noise fraction / clusters.", ""]
    out += [*hdbscan_table(cmp, floor), ""]
    out += [f"Geometry, the paper's {T3} (backbone, raw): mean [95 % t-interval].", ""]
    out += [*means_table(cmp, GEOMETRY, floor), ""]
    if len(cmp.methods) > 1:
        out += ["Geometry, paired, Holm over the geometry family:", "", *diff_table(cmp, GEOMETRY), ""]
    out += ["The other claims' metrics (backbone, raw): mean [95 % t-interval].", ""]
    out += [*means_table(cmp, OTHER_METRICS, floor), ""]
    if len(cmp.methods) > 1:
        out += ["The same, paired, Holm within each claim's family:", "", *diff_table(cmp, OTHER_METRICS), ""]
    ex = exclusion_table(runs)
    if len(ex) > 2:
        out += ["Exclusion zone (Hypersolid's raw projector outputs, cosine > alpha):", "", *ex, ""]
    out += [f"![{name}]({_rel(path, base)})" for name, path in figs.items()] + [""]
    return out


def render(
    results: Path = RESULTS, doc_dir: Path = DOC.parent, plots: bool = False
) -> tuple[str, dict[Path, str], dict[str, Any], str]:
    """(the doc's Results section, {path: text} of each group's all-metrics table, the summary, the README
    block); ``doc_dir`` is where the doc lives (its links are relative to it)."""
    cpu_all, gpu = load(results / "cpu"), load(results / "gpu")
    parts = ("cpu", "steps", "random", "tune", "views", "budget", "long", "l2", "diag", "batch", "curve100")
    part = {p: [r for r in cpu_all if r["part"] == p] for p in parts}
    cpu, steps, floor = part["cpu"], part["steps"], part["random"]
    by_name = {r["run"]: r for r in cpu_all}
    tuned_values = {m: tuned(m, by_name) for m in CPU_TUNE}  # over the widened grid (amendment 2)
    # What the 5-epoch part was planned and run on: the first grid's choice.
    first_tuned = {m: tuned(m, by_name, FIRST_TUNE[m]) for m in CPU_TUNE}
    fig_dir = results / "report"
    curve = [r for r in gpu if r["part"] == "curve"]
    cpu_cmp = compare(cpu, floor) if cpu else None
    gpu_cmp = compare(curve, floor) if curve else None  # the floor: the same initial weights, seed by seed
    if plots:
        from benchmarks.replication.figures import draw_cpu, draw_gpu, draw_long

        figs_cpu, figs_gpu = draw_cpu(cpu_cmp, fig_dir), draw_gpu(curve, fig_dir)
        figs_long = draw_long(part["long"], fig_dir)
    else:  # --check: the links the plotting run writes, without drawing
        figs_cpu = {n: fig_dir / f"{n}.png" for n in ("cpu_headline", "cpu_hdbscan") if cpu}
        figs_gpu = {n: fig_dir / f"{n}.png" for n in ("gpu_curves",) if curve}
        figs_long = {n: fig_dir / f"{n}.png" for n in ("cpu_long_curves",) if part["long"]}
    cpu_title, gpu_title = "CPU group: one epoch, each method's defaults", "GPU group: the learning curves' final epoch"
    cpu_lines = group_section(
        cpu_title, cpu_scope(cpu, floor), cpu, cpu_cmp, figs_cpu, doc_dir, fig_dir / "cpu_all_metrics.md", floor=True
    )
    gpu_lines = group_section(
        gpu_title,
        f"{DATASET}; views: {views_of(methods_in(curve))}; budget: "
        f"{max((r['epochs'] for r in curve), default=0)} epochs; tuning: none, each method's defaults; several runs "
        "at once on one GPU; random init: the CPU group's evaluations of the same initial weights "
        f"({len(floor)} of {RANDOM_SEEDS} seeds)",
        curve,
        gpu_cmp,
        figs_gpu,
        doc_dir,
        fig_dir / "gpu_curve_all_metrics.md",
        floor=True,
    )
    settings = budget_settings(by_name)
    scopes = scopes_of(part, cpu_cmp, settings, tuned_values, first_tuned)
    rows = [*verdicts(scopes), *ablation_rows(cpu_all, tuned_values["hypersolid"])]
    diag_appendix = fig_dir / "hdbscan_diagnosis.md"
    diag_lines, diag_text = diagnosis_lines(
        [*part["diag"], *part["long"], *part["l2"], *part["curve100"]], diag_appendix, lambda path: _rel(path, doc_dir)
    )
    skipped_file = results / "gpu" / "_skipped.json"
    if skipped_file.exists():
        skipped = json.loads(skipped_file.read_text())
        note = (
            f"The last GPU call ({skipped['elapsed_s']:.0f} s of a {skipped['budget_s']:.0f} s budget) left "
            f"{len(skipped['skipped'])} item(s) undone, each with its reason, in "
            f"[gpu/_skipped.json]({_rel(skipped_file, doc_dir)}); the next call resumes them."
        )
        gpu_lines += [note, ""]
    gpu_rest = [r for r in gpu if r["part"] != "curve"]
    from benchmarks.replication.sweeps import sweep_lines

    text = "\n".join(
        [
            HEADING,
            "",
            *verdict_lines(scopes, rows, part["batch"]),
            *plan_lines(cpu_all, by_name),
            *cpu_lines,
            *views_lines(part["views"], cpu),
            *tuning_lines(part["tune"], tuned_values, first_tuned),
            *budget_lines(part["budget"], settings, first_tuned, floor),
            *long_lines(part["long"], tuned_values, figs_long, lambda path: _rel(path, doc_dir)),
            *diag_lines,
            *curve100_lines(part["curve100"], tuned_values, part["long"]),
            *steps_lines(steps, cpu),
            *gpu_lines,
            *sweep_lines(gpu_rest),
        ]
    )
    summary = {
        "verdicts": rows,
        "runs": {"cpu": len(cpu), "gpu": len(gpu), **{p: len(part[p]) for p in part if p != "cpu"}},
        "tuned": tuned_values,
        "tuned_first_grid": first_tuned,
    }
    reruns = [f"{r['run']} equals {same}" for r in steps if (same := rerun(r, cpu)) is not None]
    files: dict[Path, str] = {}
    for cmp, title, name in ((cpu_cmp, cpu_title, "cpu"), (gpu_cmp, gpu_title, "gpu_curve")):
        if cmp is not None:
            files[fig_dir / f"{name}_all_metrics.md"] = all_metrics(cmp, title)
    if diag_text:
        files[diag_appendix] = diag_text
    block = readme_block(longest(scopes), cpu_cmp.floor if cpu_cmp else {}, rows, reruns)
    return text.rstrip() + "\n", files, summary, block


README_START = "<!-- replication summary: generated by benchmarks/replication/report.py; do not edit by hand -->\n"
README_END = "<!-- end of the replication summary -->\n"


def splice(doc: str, section: str) -> str:
    head, sep, _old = doc.partition("\n" + HEADING + "\n")
    if not sep:
        raise SystemExit(f"{DOC}: no '{HEADING}' heading to replace; add it at the end of the protocol")
    return head + "\n" + section


def splice_readme(readme: str, block: str) -> str:
    """README with the text between its replication markers replaced (unchanged if it has none)."""
    head, sep, rest = readme.partition(README_START)
    if not sep:
        return readme
    _old, sep, tail = rest.partition(README_END)
    if not sep:
        raise SystemExit(f"README: '{README_START.strip()}' without '{README_END.strip()}'")
    return head + README_START + block + README_END + tail


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="exit 1 if docs/replication.md is not what the JSON gives")
    p.add_argument("--results", default=str(RESULTS), help="the run JSON's folder (default %(default)s)")
    p.add_argument("--doc", default=str(DOC), help="the report to write (default %(default)s)")
    p.add_argument(
        "--readme", default=str(ROOT / "README.md"), help="whose summary block to write (default %(default)s)"
    )
    args = p.parse_args(argv)
    results, doc, readme = Path(args.results), Path(args.doc), Path(args.readme)
    for path, flag in ((doc, "--doc"), (readme, "--readme")):
        if not path.is_file():
            raise SystemExit(f"{flag} {path}: no such file (the report splices its section into an existing one)")
    section, files, summary, block = render(results, doc.parent, plots=not args.check)
    new = {
        doc: splice(doc.read_text(), section),
        readme: splice_readme(readme.read_text(), block),
        **files,
    }
    if args.check:
        stale = [str(path) for path, text in new.items() if not path.exists() or text != path.read_text()]
        if stale:
            print(
                f"{', '.join(stale)} out of date with {results}: run python -m benchmarks.replication.report",
                file=sys.stderr,
            )
            return 1
        print(f"{doc}, {readme} and the tables under {results / 'report'} match {results}")
        return 0
    for path, text in new.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_text(path, text)
    (results / "report").mkdir(parents=True, exist_ok=True)
    atomic.write_json(results / "report" / "summary.json", summary, indent=1)
    print(f"wrote {doc} ({summary['runs']['cpu']} cpu and {summary['runs']['gpu']} gpu runs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
