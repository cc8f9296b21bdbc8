"""The evaluation suites: kNN, linear probe, clustering, geometry and plots on cached features, and the
qualitative figures of a few images through the model itself.

Each metric runs under its own guard: one that cannot run on this data (``NotApplicable``: a DBSCAN
radius over the edge budget, HDBSCAN on too few points, a K larger than the memory bank, a probe
without two classes, ...) lands in ``report["skipped"]`` as ``name -> reason`` with one warning, and
every other metric is still computed. Any other exception is a real error and propagates.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch

from hypersolid_scale.eval import geometry, neighborhood
from hypersolid_scale.eval.config import EMBEDDING_SUITES, EvalConfig
from hypersolid_scale.eval.knn import knn_accuracy
from hypersolid_scale.eval.linear import linear_probe
from hypersolid_scale.eval.sampling import subsample
from hypersolid_scale.eval.skips import SkipLog

Split = tuple[torch.Tensor, torch.Tensor]


@dataclass
class Images:
    """A handful of evaluation images for the qualitative suite."""

    x: torch.Tensor  # (n, C, H, W) model inputs, normalised like the evaluation data
    labels: torch.Tensor  # (n,)
    mean: Sequence[float] | None = None  # the normalisation, undone for display (None: min-max scaled)
    std: Sequence[float] | None = None
    class_names: Sequence[str] | None = None  # row labels by class index (None: "class <k>")


def nothing_evaluated(report: dict[str, Any]) -> bool:
    """True when every requested metric and plot was skipped."""
    return not report.get("metrics") and not report.get("plots")


def run_suites(
    train: Split | None,
    test: Split | None,
    ev: EvalConfig,
    out_dir: str | Path,
    device: torch.device | str = "cpu",
    *,
    model: torch.nn.Module | None = None,
    images: Images | None = None,
) -> dict[str, Any]:
    """Run ``ev.suites`` on (feats, labels) of the train and test splits. Clustering, geometry and plots
    use the test split (the paper measures them on held-out embeddings). The qualitative suite renders
    ``images`` through ``model`` into PNGs in ``out_dir``; the splits may be None when only it runs.

    Returns ``{"metrics": {name: value}, "timings_s": {suite: s}, "plots": [paths], "skipped": {name: reason},
    "dbscan": [sweep rows] (cluster suite), "hdbscan_grid": [one row per setting] (hdbscan_grid suite),
    "interpolation": profile (geometry/plots suites),
    "qualitative": {figure: path} (qualitative suite)}``.
    """
    out_dir = Path(out_dir)
    suites = list(ev.suites)
    if "qualitative" in suites and (model is None or images is None):
        raise ValueError("the qualitative suite needs the model and the images to render: pass model= and images=")
    if any(s in EMBEDDING_SUITES for s in suites) and (train is None or test is None):
        raise ValueError(f"the suites {[s for s in suites if s in EMBEDDING_SUITES]} need the train and test features")
    # None only when no feature suite runs (checked above), so every use below has its tensors.
    (x_tr, y_tr), (x_te, y_te) = cast(Split, train or (None, None)), cast(Split, test or (None, None))
    metrics: dict[str, Any] = {}
    timings: dict[str, float] = {}
    skips = SkipLog()
    report: dict[str, Any] = {"metrics": metrics, "timings_s": timings, "plots": [], "skipped": skips.reasons}

    @contextmanager
    def timed(name: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            timings[name] = time.perf_counter() - t

    if "knn" in suites:
        with timed("knn"):
            _knn(x_tr, y_tr, x_te, y_te, ev, metrics, skips)
    if "linear" in suites:
        with timed("linear"), skips.guard("linear"):
            metrics.update(
                linear_probe(
                    x_tr,
                    y_tr,
                    x_te,
                    y_te,
                    weight_decays=ev.linear_weight_decays,
                    val_fraction=ev.linear_val_fraction,
                    optimizer=ev.linear_optimizer,
                    max_iter=ev.linear_max_iter,
                    seed=ev.seed,
                    device=device,
                )
            )
    if "cluster" in suites:
        _cluster(x_te, y_te, ev, report, skips, timed, device)
    if "hdbscan_grid" in suites:
        with timed("hdbscan_grid"), skips.guard("hdbscan_grid"):
            from hypersolid_scale.eval.hdbscan_grid import grid_metrics, hdbscan_grid  # scikit-learn: only here

            rows = hdbscan_grid(
                x_tr, x_te, y_te, sizes=ev.hdbscan_grid_sizes, per_class=ev.hdbscan_grid_per_class, seed=ev.seed
            )
            report["hdbscan_grid"] = rows
            metrics.update(grid_metrics(rows))
    if "geometry" in suites or "plots" in suites:
        with timed("geometry"):
            if "geometry" in suites:
                with skips.guard("geometry"):
                    metrics.update(geometry.embedding_metrics(x_te, max_pairs=ev.max_pairs, seed=ev.seed))
                with skips.guard("geometry_classes"):
                    metrics.update(
                        geometry.class_metrics(
                            x_te, y_te, max_pairs=ev.max_pairs, seed=ev.seed, selectivity_z=ev.selectivity_z
                        )
                    )
            with skips.guard("interpolation"):
                report["interpolation"] = neighborhood.interpolation_profile(
                    x_te, y_te, n_pairs=ev.interp_pairs, n_steps=ev.interp_steps, seed=ev.seed
                )
                if "geometry" in suites:
                    metrics.update(neighborhood.profile_summary(report["interpolation"]))
    if "plots" in suites:
        with timed("plots"):
            report["plots"] = [str(p) for p in _plots(x_te, y_te, ev, report, out_dir, skips)]
    if "qualitative" in suites:
        assert model is not None and images is not None  # checked above
        with timed("qualitative"), skips.guard("qualitative"):
            rendered = _qualitative(model, images, ev, out_dir, device, skips)
            report["qualitative"] = {name: str(p) for name, p in rendered.items()}
            report["plots"] += list(report["qualitative"].values())
    return report


def _qualitative(
    model: torch.nn.Module, images: Images, ev: EvalConfig, out_dir: Path, device: torch.device | str, skips: SkipLog
) -> dict[str, Path]:
    """The qualitative figures of ``images``: {analysis: PNG path}; an analysis that does not apply to this
    architecture (attention maps of a CNN) is recorded as ``qualitative_<analysis>``."""
    # Imported here: only this opt-in suite needs the renderer and what it pulls in.
    from hypersolid_scale.eval.qualitative import render_qualitative

    steps: dict[str, Any] = (
        {} if ev.qualitative_inversion_steps is None else {"inversion_steps": ev.qualitative_inversion_steps}
    )
    own = SkipLog()  # the renderer has warned once for each: record them under the suite's name, silently
    try:
        return render_qualitative(
            model,
            images.x,
            images.labels.tolist(),
            out_dir,
            mean=images.mean,
            std=images.std,
            class_names=images.class_names,
            seed=ev.seed,
            device=device,
            skips=own,
            **steps,
        )
    finally:
        skips.reasons.update({f"qualitative_{name}": why for name, why in own.reasons.items()})


def _knn(
    x_tr: torch.Tensor,
    y_tr: torch.Tensor,
    x_te: torch.Tensor,
    y_te: torch.Tensor,
    ev: EvalConfig,
    metrics: dict[str, Any],
    skips: SkipLog,
) -> None:
    """kNN for every K the memory bank (the train split) can serve; the larger Ks are skipped together."""
    ks = sorted({int(k) for k in ev.knn_k})
    fit = [k for k in ks if k <= len(x_tr)]
    skips.add(
        {
            f"knn_k{k}": f"K={k} exceeds the {len(x_tr)} samples of the memory bank (train split); lower eval.knn_k"
            for k in ks
            if k not in fit
        }
    )
    if fit:
        with skips.guard("knn"):
            metrics.update(knn_accuracy(x_tr, y_tr, x_te, y_te, ks=tuple(fit), temperature=ev.knn_temperature))


def _cluster(
    x: torch.Tensor,
    y: torch.Tensor,
    ev: EvalConfig,
    report: dict[str, Any],
    skips: SkipLog,
    timed: Callable[[str], AbstractContextManager[None]],
    device: torch.device | str,
) -> None:
    """K-Means, the DBSCAN eps sweep and HDBSCAN on the test embeddings (all of them unless capped).

    DBSCAN and HDBSCAN share one exact neighbour graph, built (and timed) with DBSCAN.
    """
    # Imported here: scikit-learn and HDBSCAN load only when a suite clusters (a kNN-only start, ~1 s sooner).
    from hypersolid_scale.eval import clustering

    metrics = report["metrics"]
    sub = subsample(len(x), ev.cluster_max_samples, ev.seed)
    xc, yc = x[sub], y[sub]
    with timed("kmeans"), skips.guard("kmeans"):
        km = clustering.kmeans(xc, yc, k=ev.kmeans_k, niter=ev.kmeans_niter, seed=ev.seed)
        metrics.update({f"kmeans_{k}": v for k, v in km.items() if k != "noise_fraction"})  # K-Means has no noise
    hsub = subsample(len(xc), ev.hdbscan_max_samples, ev.seed)
    hd_ms = ev.hdbscan_min_samples if ev.hdbscan_min_samples is not None else ev.hdbscan_min_cluster_size
    graph = None
    with timed("dbscan"), skips.guard("dbscan"):
        eps = (
            ev.dbscan_eps
            if ev.dbscan_eps_mode == "fixed"
            else clustering.adaptive_eps(
                xc, ev.dbscan_min_samples, ev.dbscan_eps_quantiles, seed=ev.seed, device=device
            )
        )
        # HDBSCAN reads the same graph unless it runs on a subsample of its own.
        k = max(ev.dbscan_min_samples - 1, hd_ms if len(hsub) == len(xc) else 0)
        graph = clustering.density_graph(xc, radius=max(eps), k=k, max_edges=ev.dbscan_max_edges, device=device)
        sweep = clustering.dbscan_sweep(
            xc, yc, eps=eps, min_samples=ev.dbscan_min_samples, max_edges=ev.dbscan_max_edges, graph=graph
        )
        report["dbscan"] = sweep
        # dbscan_sweep has already warned once about the radii it left out: record them without a second warning.
        skips.reasons.update({f"dbscan_eps{r['eps']:g}": str(r["skipped"]) for r in sweep if "skipped" in r})
        best = max((r for r in sweep if r["nmi"] is not None), key=lambda r: cast(float, r["nmi"]), default=None)
        if best is not None:
            metrics.update({f"dbscan_best_{k}": v for k, v in best.items() if k != "edges"})
    with timed("hdbscan"), skips.guard("hdbscan"):
        shared = graph if len(hsub) == len(xc) else None
        hd = clustering.hdbscan_cluster(
            xc[hsub],
            yc[hsub],
            min_cluster_size=ev.hdbscan_min_cluster_size,
            min_samples=ev.hdbscan_min_samples,
            graph=shared,
            max_edges=ev.dbscan_max_edges,
            device=device,
        )
        hd["n_samples"] = len(hsub)
        metrics.update({f"hdbscan_{k}": v for k, v in hd.items()})


def _plots(
    x: torch.Tensor, y: torch.Tensor, ev: EvalConfig, report: dict[str, Any], out_dir: Path, skips: SkipLog
) -> list[Path]:
    """The four PNGs of the paper's figures; each one whose input could not be computed is skipped."""
    from hypersolid_scale.eval import plots  # matplotlib loads only when plots are drawn

    paths: list[Path] = []
    with skips.guard("plot_similarity_density"):
        pos, neg = geometry.pair_similarities(x, y, max_pairs=ev.max_pairs, seed=ev.seed)
        paths.append(plots.plot_similarity_density(pos, neg, out_dir / "similarity_density.png"))
    paths.append(plots.plot_centroid_heatmap(geometry.centroid_cosine(x, y), out_dir / "centroid_cosine.png"))
    if "interpolation" in report:
        paths.append(plots.plot_interpolation_profile(report["interpolation"], out_dir / "interpolation_profile.png"))
    else:
        skips.add({"plot_interpolation_profile": "the interpolation profile was skipped"})
    if "dbscan" in report:
        paths.append(plots.plot_dbscan_sweep(report["dbscan"], out_dir / "dbscan_eps.png"))
    elif "cluster" in ev.suites:
        skips.add({"plot_dbscan_eps": "the DBSCAN sweep was skipped"})
    else:
        skips.add({"plot_dbscan_eps": "it needs the 'cluster' suite; add it to --suite"})
    return paths
