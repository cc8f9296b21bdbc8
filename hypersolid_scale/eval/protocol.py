"""Evaluation protocols: a fixed set of metrics on fixed features, run by ``launch/eval.py --protocol NAME``.

The ``paper`` protocol (docs/replication.md, "Protocol") evaluates four feature kinds, ``backbone`` and
``projector`` outputs, each ``raw`` and ``centred`` (the train split's mean subtracted from both splits,
then each metric's usual normalisation), with the existing suites: kNN at K = 5 and 20, the linear probe (raw),
the geometry suite, spherical K-Means (k = classes), HDBSCAN at every ``min_cluster_size`` of a grid and
the adaptive DBSCAN sweep (one eps per fraction of core points), each clustering scored with NMI, AMI,
ARI, noise fraction and number of clusters. Noise (label -1) counts as one more cluster in NMI, AMI and
ARI (``clustering.cluster_scores``' convention); its fraction is reported beside them. Plus one mechanism
diagnostic: the fraction of same-class and of different-class test pairs whose cosine on the
L2-normalised raw projector outputs (the method's projection head) exceeds alpha (the checkpoint's loss alpha,
``default_alpha`` for a method without one): Hypersolid's exclusion zone.

``report.json``'s ``metrics`` then hold one flat key per number, ``protocol.<features>.<norm>.<metric>``:

    protocol.{backbone,projector}.{raw,centred}.knn_k{5,20}_{weighted,majority}     accuracy %
    protocol.<f>.raw.linear_{top1,train_top1,weight_decay}   (raw only: the probe standardises, so centring
                                                             changes nothing)
    protocol.<f>.<n>.kmeans.{nmi,ami,ari,noise_fraction,n_clusters}
    protocol.<f>.<n>.hdbscan_mcs{5,10,25,50,100}.{nmi,ami,ari,noise_fraction,n_clusters,exact_tree}
    protocol.<f>.<n>.dbscan_q{05,10,...,95}.{eps,nmi,ami,ari,noise_fraction,n_clusters}   (q = % core points)
    protocol.<f>.<n>.geometry.<name>        the geometry suite's metrics (anisotropy, d_prime, interp_gap, ...)
    protocol.exclusion.{alpha,same_class_frac,diff_class_frac,same_class_pairs,diff_class_pairs}

A metric that cannot run is absent and listed under ``report["skipped"]`` with the same key stem. Every
grid value is reported; nothing is picked on the test split.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.metrics import adjusted_mutual_info_score

from hypersolid_scale.eval import clustering, density, geometry
from hypersolid_scale.eval.config import EvalConfig
from hypersolid_scale.eval.cosine_search import as_unit_float32
from hypersolid_scale.eval.pairs import NeighbourGraph, knn_distance_sample
from hypersolid_scale.eval.sampling import subsample
from hypersolid_scale.eval.skips import NotApplicable, SkipLog
from hypersolid_scale.eval.suites import Split, run_suites

NORMS: tuple[str, ...] = ("raw", "centred")
PREFIX = "protocol"


@dataclass(frozen=True)
class Protocol:
    """A protocol as data: ``eval.*`` overrides (applied before the user's, which may still change them) and
    what the suites have no setting for."""

    name: str
    overrides: tuple[str, ...]
    features: tuple[str, ...] = ("backbone", "projector")
    hdbscan_min_cluster_sizes: tuple[int, ...] = (5, 10, 25, 50, 100)
    # The suites that run_suites computes on each feature kind; clustering is the protocol's own (AMI, grids).
    suites: tuple[str, ...] = ("knn", "linear", "geometry")
    # The probe standardises every dimension with the train split's statistics, which removes the train mean
    # already: on centred features it would fit the same problem again (same accuracy up to rounding).
    centred_suites: tuple[str, ...] = ("knn", "geometry")
    default_alpha: float = 0.9  # when the checkpoint records no loss alpha


PAPER = Protocol(
    name="paper",
    overrides=(
        "eval.knn_k=[5,20]",  # the paper's K on small data sets, and the K of the quick comparison
        "eval.dbscan_eps_mode=adaptive",  # the same fractions of core points for every checkpoint's scale
        "eval.dbscan_min_samples=5",
        "eval.kmeans_k=null",  # k = number of classes
        # One weight decay, 100 L-BFGS iterations: the probe of the full grid (5 decays x 200 iterations) takes
        # minutes per feature kind on a 2-core CPU; docs/replication.md states the choice.
        "eval.linear_weight_decays=[0.0001]",
        "eval.linear_max_iter=100",
        "eval.max_pairs=1000000",
        # A seeded 10,000-image memory bank / probe training set and 100 interpolation pairs: the four feature
        # kinds then take well under a minute on a 2-core CPU (the full 60,000-image bank of Fashion-MNIST
        # takes minutes at 1024 dimensions); docs/replication.md states it.
        "eval.max_train_samples=10000",
        "eval.interp_pairs=100",
    ),
)
PROTOCOLS: dict[str, Protocol] = {PAPER.name: PAPER}


def get_protocol(name: str) -> Protocol:
    """The protocol called ``name``; ``KeyError`` with the known names otherwise."""
    if name not in PROTOCOLS:
        raise KeyError(f"unknown protocol {name!r}; choose one of {sorted(PROTOCOLS)}")
    return PROTOCOLS[name]


# ----------------------------------------------------------------------------------------------------------
# Features
# ----------------------------------------------------------------------------------------------------------


def centred(train: Split, test: Split) -> tuple[Split, Split]:
    """Both splits minus the train split's mean: the offset shared by every embedding (which cosine metrics
    see as similarity) is removed with statistics of the training data only."""
    mean = train[0].double().mean(0).float()
    return (train[0] - mean, train[1]), (test[0] - mean, test[1])


# ----------------------------------------------------------------------------------------------------------
# Clustering with AMI
# ----------------------------------------------------------------------------------------------------------


def scores(labels_true: np.ndarray, labels_pred: np.ndarray) -> dict[str, float]:
    """``clustering.cluster_scores`` plus AMI (chance-corrected: NMI grows with the number of clusters)."""
    return {
        **clustering.cluster_scores(labels_true, labels_pred),
        "ami": float(adjusted_mutual_info_score(labels_true, labels_pred)),
    }


def _shared_graph(x: np.ndarray, eps: list[float], ms: int, ev: EvalConfig, device: str) -> NeighbourGraph:
    """One neighbour graph for the DBSCAN sweep and every HDBSCAN: the sweep's largest eps or the radius that
    holds 90 % of the points' core distances at the largest min_samples (``hdbscan_cluster``'s choice),
    whichever is larger, and that many nearest neighbours."""
    radius = float(np.quantile(knn_distance_sample(x, ms, clustering.QUANTILE_QUERIES, ev.seed, device), 0.9))
    return clustering.density_graph(
        x,
        radius=max(max(eps), radius),
        k=max(ms, ev.dbscan_min_samples - 1),
        max_edges=ev.dbscan_max_edges,
        device=device,
    )


def clusterings(
    x_te: torch.Tensor, y_te: torch.Tensor, ev: EvalConfig, proto: Protocol, skips: SkipLog, device: str = "cpu"
) -> dict[str, Any]:
    """K-Means, the adaptive DBSCAN sweep and the HDBSCAN grid on the test features, flat ``name.score`` keys."""
    sub = subsample(len(x_te), ev.cluster_max_samples, ev.seed)
    x, y = as_unit_float32(x_te[sub]), y_te[sub].numpy().astype(np.int64)
    n, out = len(x), {}
    with skips.guard("kmeans"):
        k = ev.kmeans_k or len(np.unique(y))
        if not 2 <= k <= n:
            raise NotApplicable(f"K-Means needs 2 <= k <= n; got k={k} for n={n} points")
        assign = clustering.kmeans_assign(x, k, niter=ev.kmeans_niter, seed=ev.seed, use_gpu=False)
        out.update({f"kmeans.{s}": v for s, v in scores(y, assign).items()})
    if n < 3:
        skips.add({"dbscan": f"{n} points", "hdbscan": f"{n} points"})
        return out
    # The eps of each fraction q of core points, as clustering.adaptive_eps draws it, kept per q (that function
    # merges equal radii) so that every checkpoint reports the same keys.
    ms = min(max(ev.dbscan_min_samples - 1, 1), n - 1)
    kd = knn_distance_sample(x, ms, clustering.QUANTILE_QUERIES, seed=ev.seed, device=device)
    eps = {f"dbscan_q{round(100 * q):02d}": round(float(np.quantile(kd, q)), 4) for q in ev.dbscan_eps_quantiles}
    graph = _shared_graph(x, list(eps.values()), min(max(proto.hdbscan_min_cluster_sizes), n - 1), ev, device)
    fits = {name: e for name, e in eps.items() if max(e, density.EPS_FLOOR) <= graph.radius}
    skips.add(
        {
            name: f"its neighbourhood graph exceeds eval.dbscan_max_edges={ev.dbscan_max_edges}"
            for name in eps
            if name not in fits
        }
    )
    for (name, e), pred in zip(
        fits.items(), density.dbscan_sweep_labels(graph, ev.dbscan_min_samples, list(fits.values()))
    ):
        out.update({f"{name}.eps": e, **{f"{name}.{s}": v for s, v in scores(y, pred).items()}})
    for m in proto.hdbscan_min_cluster_sizes:
        with skips.guard(f"hdbscan_mcs{m}"):
            if n <= m:
                raise NotApplicable(f"HDBSCAN needs more than min_cluster_size={m} points, got {n}")
            pred, exact = density.hdbscan_labels(x, graph, min_cluster_size=m, min_samples=m, device=device)
            out.update({f"hdbscan_mcs{m}.{s}": v for s, v in scores(y, pred).items()})
            out[f"hdbscan_mcs{m}.exact_tree"] = exact
    return out


# ----------------------------------------------------------------------------------------------------------
# The mechanism diagnostic
# ----------------------------------------------------------------------------------------------------------


def exclusion_zone(
    feats: torch.Tensor, labels: torch.Tensor, alpha: float, *, max_pairs: int, seed: int
) -> dict[str, float]:
    """Fractions of same-class and of different-class pairs with cosine > ``alpha`` (L2-normalised features),
    on the pairs of ``geometry.pair_similarities`` (at most ``max_pairs`` of each kind, seeded)."""
    pos, neg = geometry.pair_similarities(feats, labels, max_pairs=max_pairs, seed=seed)
    return {
        "alpha": float(alpha),
        "same_class_frac": float(np.mean(pos > alpha)),
        "diff_class_frac": float(np.mean(neg > alpha)),
        "same_class_pairs": int(pos.size),
        "diff_class_pairs": int(neg.size),
    }


# ----------------------------------------------------------------------------------------------------------
# The whole protocol
# ----------------------------------------------------------------------------------------------------------


def run_protocol(
    features: dict[str, tuple[Split, Split]],
    ev: EvalConfig,
    proto: Protocol,
    out_dir: str | Path,
    *,
    alpha: float,
    device: torch.device | str = "cpu",
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run ``proto`` on ``{features: (train, test)}`` (cached embeddings); a report like ``run_suites``' with
    the flat ``protocol.*`` keys of the module docstring."""
    metrics: dict[str, Any] = {}
    timings: dict[str, float] = {}
    skips = SkipLog()
    suite_ev = {
        "raw": replace(ev, suites=list(proto.suites)),
        "centred": replace(ev, suites=list(proto.centred_suites)),
    }
    for kind in proto.features:
        if kind not in features:
            continue
        train, test = features[kind]
        for norm in NORMS:
            tr, te = (train, test) if norm == "raw" else centred(train, test)
            stem = f"{PREFIX}.{kind}.{norm}"
            t0 = time.perf_counter()
            rep = run_suites(tr, te, suite_ev[norm], out_dir, device=device)
            # The geometry metrics get a level of their own: their names share no prefix.
            own = ("knn_", "linear_")
            metrics.update(
                {f"{stem}.{k}" if k.startswith(own) else f"{stem}.geometry.{k}": v for k, v in rep["metrics"].items()}
            )
            skips.reasons.update({f"{stem}.{k}": why for k, why in rep["skipped"].items()})
            timings.update({f"{stem}.{k}": s for k, s in rep["timings_s"].items()})
            t1 = time.perf_counter()
            local = SkipLog()
            found = clusterings(te[0], te[1], ev, proto, local, device=str(device))
            metrics.update({f"{stem}.{k}": v for k, v in found.items()})
            skips.reasons.update({f"{stem}.{k}": why for k, why in local.reasons.items()})
            timings[f"{stem}.cluster"] = time.perf_counter() - t1
            if log is not None:
                log(f"{stem}: {time.perf_counter() - t0:.1f} s")
    if "projector" in features:
        with skips.guard(f"{PREFIX}.exclusion"):
            found = exclusion_zone(*features["projector"][1], alpha, max_pairs=ev.max_pairs, seed=ev.seed)
            metrics.update({f"{PREFIX}.exclusion.{k}": v for k, v in found.items()})
    else:
        why = "it needs the method's projection head (published backbones and methods without one have none)"
        skips.add({f"{PREFIX}.{k}": why for k in ("exclusion", *(f for f in proto.features if f not in features))})
    return {"metrics": metrics, "timings_s": timings, "plots": [], "skipped": skips.reasons}


# The console's view of a protocol report (report.json holds every key): the headline of each feature kind.
SUMMARY_ENDINGS = ("knn_k5_weighted", "knn_k20_weighted", "linear_top1", "kmeans.ami")


def summary(metrics: dict[str, Any]) -> dict[str, Any]:
    """The metrics the console shows: kNN, linear probe, AMI of K-Means and of every HDBSCAN, the diagnostic."""

    def shown(key: str) -> bool:
        hdbscan_ami = ".hdbscan_mcs" in key and key.endswith(".ami")
        return key.endswith(SUMMARY_ENDINGS) or hdbscan_ami or key.startswith(f"{PREFIX}.exclusion.")

    return {k: v for k, v in metrics.items() if shown(k)}
