"""The replication study's report: docs/replication.md's "Results" section, generated from the committed run
JSON (benchmarks/results/replication/<group>/<run>.json, written by run.py) and nothing else.

    python benchmarks/replication/report.py            # rewrite the Results section, the plots and summary.json
    python benchmarks/replication/report.py --check    # exit 1 if the committed section is not what the JSON gives

Everything above the "## Results" heading (the protocol, fixed before the runs) is left as it is. The
statistics are eval/stats.py's; the verdict rules are stated in the generated text and in claims.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))  # benchmarks/: the base the other benchmark scripts import from
sys.path.insert(0, str(ROOT))
from replication.claims import (  # noqa: E402
    BB,
    GEOMETRY,
    HEADLINE,
    Comparison,
    compare,
    verdicts,
)
from replication.tables import (  # noqa: E402
    all_metrics,
    diff_table,
    exclusion_table,
    hdbscan_table,
    means_table,
    rerun,
    run_table,
    steps_lines,
    verdict_table,
)

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
) -> list[str]:
    """One group's part of the Results section; ``cmp`` is ``compare(runs)`` (None when no run)."""
    if not runs or cmp is None:
        return [f"### {title}", "", "Not run yet.", ""]
    out = [f"### {title}", "", f"Scope: {scope}.", "", *run_table(runs), ""]
    out += [
        f"Every backbone metric (raw and centred), with the same tests: [{appendix.name}]({_rel(appendix, base)}).",
        "",
    ]
    out += [
        "Headline metrics (backbone, raw features): mean [95 % t-interval] over seeds.",
        "",
        *means_table(cmp, HEADLINE),
        "",
    ]
    if len(cmp.methods) > 1:
        out += [
            (
                "Paired by seed, method − Hypersolid: mean difference [95 % t-interval], Holm-adjusted p over the "
                "headline family; * marks adjusted p < 0.05."
            ),
            "",
            *diff_table(cmp, "headline", HEADLINE),
            "",
        ]
    out += ["HDBSCAN, every setting (backbone, raw): mean AMI / NMI / ARI / noise fraction / clusters.", ""]
    out += [*hdbscan_table(cmp), ""]
    out += ["Geometry (backbone, raw): mean [95 % t-interval].", "", *means_table(cmp, GEOMETRY), ""]
    if len(cmp.methods) > 1:
        out += ["Geometry, paired, Holm over the geometry family:", "", *diff_table(cmp, "geometry", GEOMETRY), ""]
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
    cpu, steps = [r for r in cpu_all if r["part"] == "cpu"], [r for r in cpu_all if r["part"] == "steps"]
    fig_dir = results / "report"
    curve = [r for r in gpu if r["part"] == "curve"]
    cpu_cmp, gpu_cmp = (compare(runs) if runs else None for runs in (cpu, curve))
    if plots:
        from replication.figures import draw_cpu, draw_gpu

        figs_cpu, figs_gpu = draw_cpu(cpu_cmp, fig_dir), draw_gpu(curve, fig_dir)
    else:  # --check: the links the plotting run writes, without drawing
        figs_cpu = {n: fig_dir / f"{n}.png" for n in ("cpu_headline", "cpu_hdbscan") if cpu}
        figs_gpu = {n: fig_dir / f"{n}.png" for n in ("gpu_curves",) if curve}
    cpu_title, gpu_title = "CPU group: one epoch, each method's defaults", "GPU group: the learning curves' final epoch"
    cpu_lines = group_section(
        cpu_title,
        "Fashion-MNIST, the quickstart's 4-block CNN at 28 px, 2 + 4 views, global batch 128, one epoch "
        "(468 steps), each method's defaults (no tuning), one process on a 2-core CPU; 5 seeds for Hypersolid "
        "and SimCLR, 3 for SwaV and Barlow Twins (fewer than the protocol's 5: the CPU budget)",
        cpu,
        cpu_cmp,
        figs_cpu,
        doc_dir,
        fig_dir / "cpu_all_metrics.md",
    )
    gpu_lines = group_section(
        gpu_title,
        "Fashion-MNIST, the same network and views, global batch 128, "
        f"{max((r['epochs'] for r in curve), default=0)} epochs, several runs at once on one GPU",
        curve,
        gpu_cmp,
        figs_gpu,
        doc_dir,
        fig_dir / "gpu_curve_all_metrics.md",
    )
    rows = verdicts(cpu_cmp, gpu)
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
    from replication.sweeps import sweep_lines

    text = "\n".join(
        [
            HEADING,
            "",
            "Generated by `python benchmarks/replication/report.py` from the JSON in",
            "[benchmarks/results/replication/](../benchmarks/results/replication/); do not edit by hand. The",
            "verdict rules (benchmarks/replication/claims.py) were committed before the first baseline run of the",
            "CPU group had finished: a claim **holds here** when Hypersolid differs from every baseline in the",
            "claimed direction on some metric of the claim at Holm-adjusted p < 0.05 (paired by seed) and in the",
            "opposite direction on none; it **does not hold here** when some baseline is better on some metric of the",
            "claim at that level; otherwise it is **inconclusive here**. A parity claim (kNN, linear probe) holds",
            "unless some baseline is significantly better, provided every baseline has at least two paired seeds",
            "(otherwise it is inconclusive). **Not testable here**: the runs that would test it have",
            "not been done. The Holm families: headline (the 9 metrics below), geometry (6), and every other",
            "backbone metric (in the all-metrics tables).",
            "",
            *verdict_table(rows),
            "",
            *cpu_lines,
            *steps_lines(steps, cpu),
            *gpu_lines,
            *sweep_lines(gpu_rest),
        ]
    )
    summary = {"verdicts": rows, "runs": {"cpu": len(cpu), "gpu": len(gpu)}}
    reruns = [f"{r['run']} equals {same}" for r in steps if (same := rerun(r, cpu)) is not None]
    files: dict[Path, str] = {}
    for cmp, title, name in ((cpu_cmp, cpu_title, "cpu"), (gpu_cmp, gpu_title, "gpu_curve")):
        if cmp is not None:
            files[fig_dir / f"{name}_all_metrics.md"] = all_metrics(cmp, title)
    return text.rstrip() + "\n", files, summary, readme_block(cpu_cmp, rows, reruns)


README_METRICS = (
    (f"{BB}knn_k5_majority", "kNN@5 (%)"),
    (f"{BB}linear_top1", "linear probe (%)"),
    (f"{BB}kmeans.ami", "K-Means AMI"),
    (f"{BB}hdbscan_mcs10.ami", "HDBSCAN AMI, min_cluster_size 10 (every setting in the report)"),
    (f"{BB}geometry.sparsity", "sparsity"),
    (f"{BB}geometry.anisotropy", "anisotropy"),
)


def readme_block(cpu: Comparison | None, rows: Sequence[dict[str, str]], reruns: Sequence[str] = ()) -> str:
    """The README's summary of the study: the CPU group's means and the verdicts, linking to the report."""
    intro = (
        "**Replication study** ([docs/replication.md](docs/replication.md), generated from "
        "[benchmarks/results/replication/](benchmarks/results/replication/)): the protocol was fixed before the "
        "runs; methods are paired by seed."
    )
    lines = [intro, ""]
    if cpu is None:
        lines.append("The CPU group has not run yet.")
    else:
        lines += [
            (
                "Fashion-MNIST, the quickstart CNN, one epoch on a CPU, each method's defaults; "
                "mean [95 % interval] (n seeds):"
            ),
            "",
            *means_table(cpu, README_METRICS),
        ]
    by_verdict: dict[str, list[str]] = {}
    for r in rows:
        by_verdict.setdefault(r["verdict"], []).append(r["claim"])
    lines += ["", "Verdicts on the paper's claims at this scope:", ""]
    lines += [f"* **{v}**: " + "; ".join(claims) + "." for v, claims in by_verdict.items()]
    if reruns:
        lines += ["", "Reruns: " + "; ".join(reruns) + "."]
    return "\n".join(lines) + "\n"


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
                f"{', '.join(stale)} out of date with {results}: run python benchmarks/replication/report.py",
                file=sys.stderr,
            )
            return 1
        print(f"{doc}, {readme} and the tables under {results / 'report'} match {results}")
        return 0
    for path, text in new.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (results / "report").mkdir(parents=True, exist_ok=True)
    (results / "report" / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"wrote {doc} ({summary['runs']['cpu']} cpu and {summary['runs']['gpu']} gpu runs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
