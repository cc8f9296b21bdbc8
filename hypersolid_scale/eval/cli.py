"""``launch/eval.py``: evaluate a checkpoint on its dataset, print a table, write a report, log to MLflow.

    python launch/eval.py --checkpoint runs/quickstart/checkpoints/step_00001407.pt \
        [--suite knn,linear,cluster,geometry,plots] [--features backbone|projector] \
        [--output-dir DIR] [--device auto|cpu|cuda] [--no-mlflow] [data.key=value eval.key=value ...]

Steps: load the checkpoint and rebuild its model -> embed the train and test splits with the eval
transform (sharded over ranks under torchrun, cached on disk) -> on rank 0, run the chosen suites on
the cached features -> ``report.json``, ``report.md`` and PNGs in the output directory -> MLflow: the
training run recorded in the checkpoint when it can be found, else a new run tagged with the checkpoint.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hypersolid_scale.eval import clustering, geometry, neighborhood, plots
from hypersolid_scale.eval.config import FEATURES, SUITES, EvalConfig
from hypersolid_scale.eval.embed import cached_embeddings, embedding_fingerprint, file_fingerprint
from hypersolid_scale.eval.knn import knn_accuracy
from hypersolid_scale.eval.linear import linear_probe
from hypersolid_scale.eval.report import format_table, write_report

# Sections a user may change at evaluation time; the model section must stay what the weights were trained as.
OVERRIDABLE = ("data.", "eval.", "tracking.")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Evaluate a Hypersolid checkpoint (kNN, linear probe, clustering, "
                                            "geometry, plots).")
    p.add_argument("--checkpoint", required=True, help="path to a step_*.pt file")
    p.add_argument("--suite", default=None, help=f"comma-separated subset of {','.join(SUITES)} (default: eval.suites)")
    p.add_argument("--features", default=None, choices=FEATURES, help="default: eval.features (backbone)")
    p.add_argument("--output-dir", default=None, help="default: <run_dir>/eval/<checkpoint name>")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")
    p.add_argument("overrides", nargs="*", help="data.key=value / eval.key=value / tracking.key=value")
    return p.parse_args(argv)


# ----------------------------------------------------------------------------------------------------------
# Checkpoint -> model + config
# ----------------------------------------------------------------------------------------------------------


def load_model(path: str | Path, overrides: list[str]) -> tuple[torch.nn.Module, Any, dict[str, Any]]:
    """(model in eval mode, Config with overrides applied, raw checkpoint dict); clear errors for bad input."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from hypersolid_scale.checkpoint import build_model_from_checkpoint, load_checkpoint
    from hypersolid_scale.config import from_dict, validate

    for ov in overrides:
        if "=" not in ov or not ov.startswith(OVERRIDABLE):
            raise ValueError(f"override {ov!r} is not allowed here: write section.key=value with a section among "
                             f"{[s.rstrip('.') for s in OVERRIDABLE]} (the model must stay the checkpoint's)")
    ckpt = load_checkpoint(path)  # FileNotFoundError / ValueError with the path in the message
    try:
        model, _ = build_model_from_checkpoint(ckpt)
    except RuntimeError as err:  # load_state_dict: missing/unexpected keys or shape mismatches
        arch = ckpt["config"].get("model", {}).get("arch", "?") if isinstance(ckpt["config"], dict) else "?"
        detail = " ".join(str(err).split())[:400]
        raise ValueError(f"checkpoint {str(path)!r} holds weights of another architecture than its config "
                         f"(model.arch={arch}) describes, so no model can be rebuilt from it: {detail}") from None
    try:
        merged = OmegaConf.merge(OmegaConf.create(ckpt["config"]), OmegaConf.from_dotlist(list(overrides)))
        cfg = from_dict(OmegaConf.to_container(merged))
    except OmegaConfBaseException as err:
        raise ValueError(f"bad override in {overrides}: {str(err).splitlines()[0]}") from None
    validate(cfg)
    return model, cfg, ckpt


def default_output_dir(checkpoint: Path) -> Path:
    """``<run_dir>/eval/<step_x>`` for checkpoints inside ``<run_dir>/checkpoints``, else next to the file."""
    if checkpoint.parent.name == "checkpoints":
        return checkpoint.parent.parent / "eval" / checkpoint.stem
    return checkpoint.parent / f"eval_{checkpoint.stem}"


# ----------------------------------------------------------------------------------------------------------
# Suites on features
# ----------------------------------------------------------------------------------------------------------


def run_suites(train: tuple[torch.Tensor, torch.Tensor], test: tuple[torch.Tensor, torch.Tensor],
               ev: EvalConfig, out_dir: str | Path, device: torch.device | str = "cpu") -> dict[str, Any]:
    """Run ``ev.suites`` on (feats, labels) of the train and test splits. Clustering, geometry and plots
    use the test split (the paper measures them on held-out embeddings)."""
    out_dir = Path(out_dir)
    (x_tr, y_tr), (x_te, y_te) = train, test
    metrics: dict[str, Any] = {}
    timings: dict[str, float] = {}
    report: dict[str, Any] = {"metrics": metrics, "timings_s": timings, "plots": []}
    suites = list(ev.suites)
    sub = clustering.subsample(len(x_te), ev.cluster_max_samples, ev.seed)
    xc, yc = x_te[sub], y_te[sub]

    def timed(name: str) -> Any:
        class _T:
            def __enter__(self) -> None:
                self.t = time.perf_counter()

            def __exit__(self, *exc: Any) -> None:
                timings[name] = time.perf_counter() - self.t
        return _T()

    if "knn" in suites:
        with timed("knn"):
            metrics.update(knn_accuracy(x_tr, y_tr, x_te, y_te, ks=tuple(ev.knn_k), temperature=ev.knn_temperature))
    if "linear" in suites:
        with timed("linear"):
            metrics.update(linear_probe(x_tr, y_tr, x_te, y_te, weight_decays=ev.linear_weight_decays,
                                        val_fraction=ev.linear_val_fraction, optimizer=ev.linear_optimizer,
                                        max_iter=ev.linear_max_iter, seed=ev.seed, device=device))
    if "cluster" in suites:
        with timed("kmeans"):
            km = clustering.kmeans(xc, yc, k=ev.kmeans_k, niter=ev.kmeans_niter, seed=ev.seed)
            metrics.update({f"kmeans_{k}": v for k, v in km.items() if k != "noise_fraction"})  # K-Means has no noise
        with timed("dbscan"):
            sweep = clustering.dbscan_sweep(xc, yc, eps=ev.dbscan_eps, min_samples=ev.dbscan_min_samples,
                                            max_edges=ev.dbscan_max_edges)
            report["dbscan"] = sweep
            best = max((r for r in sweep if r["nmi"] is not None), key=lambda r: r["nmi"], default=None)
            if best is not None:
                metrics.update({f"dbscan_best_{k}": v for k, v in best.items() if k != "edges"})
        with timed("hdbscan"):
            hsub = clustering.subsample(len(xc), ev.hdbscan_max_samples, ev.seed)
            hd = clustering.hdbscan_cluster(xc[hsub], yc[hsub], min_cluster_size=ev.hdbscan_min_cluster_size)
            hd["n_samples"] = len(hsub)
            metrics.update({f"hdbscan_{k}": v for k, v in hd.items()})
    if "geometry" in suites or "plots" in suites:
        with timed("geometry"):
            if "geometry" in suites:
                metrics.update(geometry.geometry_metrics(x_te, y_te, max_pairs=ev.max_pairs, seed=ev.seed,
                                                         selectivity_z=ev.selectivity_z))
            profile = neighborhood.interpolation_profile(x_te, y_te, n_pairs=ev.interp_pairs,
                                                         n_steps=ev.interp_steps, seed=ev.seed)
            report["interpolation"] = profile
            if "geometry" in suites:
                metrics.update(neighborhood.profile_summary(profile))
    if "plots" in suites:
        with timed("plots"):
            pos, neg = geometry.pair_similarities(x_te, y_te, max_pairs=ev.max_pairs, seed=ev.seed)
            paths = [plots.plot_similarity_density(pos, neg, out_dir / "similarity_density.png"),
                     plots.plot_centroid_heatmap(geometry.centroid_cosine(x_te, y_te), out_dir / "centroid_cosine.png"),
                     plots.plot_interpolation_profile(report["interpolation"], out_dir / "interpolation_profile.png")]
            if "dbscan" in report:
                paths.append(plots.plot_dbscan_sweep(report["dbscan"], out_dir / "dbscan_eps.png"))
            else:
                warnings.warn("the DBSCAN plot needs the 'cluster' suite; add it to --suite to get dbscan_eps.png",
                              stacklevel=2)
            report["plots"] = [str(p) for p in paths]
    return report


# ----------------------------------------------------------------------------------------------------------
# MLflow
# ----------------------------------------------------------------------------------------------------------


def log_to_mlflow(report: dict[str, Any], ckpt: dict[str, Any], cfg: Any, checkpoint: Path, out_dir: Path,
                  run_dir: Path) -> None:
    """Log metrics (``eval/<name>`` at the checkpoint's step) and artifacts; fill report["meta"] with the run."""
    from hypersolid_scale.tracking import make_tracker

    tags = {"eval.checkpoint": str(checkpoint.resolve()), "eval.step": int(ckpt["step"])}
    tcfg = cfg.tracking
    if ckpt.get("tracking_uri"):
        tcfg.tracking_uri = ckpt["tracking_uri"]
    elif tcfg.tracking_uri is None:  # training was not tracked: keep the eval run next to the training run
        tcfg.tracking_uri = f"sqlite:///{run_dir.resolve()}/mlflow.db"
    tracker = None
    if ckpt.get("mlflow_run_id"):
        try:
            tracker = make_tracker(tcfg, out_dir, rank=0, resume_run_id=ckpt["mlflow_run_id"], tags=tags)
        except ValueError as err:
            print(f"[eval] training run not found ({err}); logging to a new MLflow run instead", file=sys.stderr)
    if tracker is None:
        tcfg.run_name = tcfg.run_name or f"eval-{checkpoint.stem}"
        tracker = make_tracker(tcfg, out_dir, rank=0, tags={**tags, "eval.kind": "offline-eval"})
    step = int(ckpt["step"])
    numeric = {f"eval/{k}": float(v) for k, v in report["metrics"].items() if isinstance(v, (int, float))}
    tracker.log_metrics(numeric, step=step)
    for r in report.get("dbscan", []):  # the sweep as a curve: x = eps in thousandths
        if r["nmi"] is not None:
            tracker.log_metrics({"eval/dbscan_nmi_vs_eps": r["nmi"], "eval/dbscan_ari_vs_eps": r["ari"]},
                                step=int(round(1000 * r["eps"])))
    for name in ("report.json", "report.md", *[Path(p).name for p in report.get("plots", [])]):
        tracker.log_artifact(out_dir / name, artifact_path=f"eval/{checkpoint.stem}")
    tracker.close()
    report["meta"].update(mlflow_run_id=tracker.run_id, tracking_uri=tracker.tracking_uri)


# ----------------------------------------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    from hypersolid_scale.data import build_eval_datasets, in_channels
    from hypersolid_scale.distributed.env import cleanup, init_distributed

    args = parse_args(argv)
    checkpoint = Path(args.checkpoint)
    model, cfg, ckpt = load_model(checkpoint, args.overrides)
    ev: EvalConfig = cfg.eval
    if args.suite is not None:
        ev.suites = [s.strip() for s in args.suite.split(",") if s.strip()]
    if args.features is not None:
        ev.features = args.features
    ev.validate()
    if in_channels(cfg.data) != cfg.model.in_channels:
        raise ValueError(f"data.dataset={cfg.data.dataset!r} has {in_channels(cfg.data)}-channel images but the "
                         f"checkpoint's model takes {cfg.model.in_channels}; evaluate it on data like its "
                         "training data")
    info, device = init_distributed(device=args.device)
    try:
        model.to(device)
        out_dir = Path(args.output_dir) if args.output_dir else default_output_dir(checkpoint)
        run_dir = checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint.parent
        cache_dir = Path(ev.cache_dir) if ev.cache_dir else run_dir / "eval_cache"
        ckpt_fp = file_fingerprint(checkpoint)
        data_dict = asdict(cfg.data)
        train_ds, test_ds = build_eval_datasets(cfg.data)
        t0 = time.perf_counter()
        splits = {}
        for split, ds in (("train", train_ds), ("test", test_ds)):
            fp = embedding_fingerprint(ckpt_fp, data_dict, split, ev.features, len(ds))
            x, y, hit = cached_embeddings(model, ds, cache_dir=cache_dir, fingerprint=fp, batch_size=ev.batch_size,
                                          device=device, which=ev.features, num_workers=ev.num_workers,
                                          desc=f"embed {split}")
            splits[split] = (x, y)
            if info.rank == 0:
                print(f"[eval] {split}: {tuple(x.shape)} {ev.features} features ({'cache' if hit else 'extracted'})")
        embed_s = time.perf_counter() - t0
        if info.rank != 0:
            return 0
        report = run_suites(splits["train"], splits["test"], ev, out_dir, device=device)
        report["timings_s"] = {"embed": embed_s, **report["timings_s"]}
        report["meta"] = {"checkpoint": str(checkpoint), "step": int(ckpt["step"]), "epoch": int(ckpt["epoch"]),
                          "arch": cfg.model.arch, "dataset": cfg.data.dataset, "features": ev.features,
                          "feature_dim": int(splits["train"][0].shape[1]), "n_train": len(splits["train"][1]),
                          "n_test": len(splits["test"][1]), "suites": list(ev.suites), "world_size": info.world_size}
        report["eval_config"] = asdict(ev)
        write_report(report, out_dir)
        if not args.no_mlflow and cfg.tracking.enabled:
            log_to_mlflow(report, ckpt, cfg, checkpoint, out_dir, run_dir)
            write_report(report, out_dir)  # now with the MLflow run id
        title = (f"{checkpoint} (step {ckpt['step']}, {cfg.model.arch}, {cfg.data.dataset}, "
                 f"{ev.features} features, n_train={report['meta']['n_train']}, n_test={report['meta']['n_test']})")
        print(format_table(report["metrics"], title=title))
        print(f"[eval] report: {out_dir / 'report.json'}, {out_dir / 'report.md'}"
              + (f"; MLflow run {report['meta']['mlflow_run_id']}" if "mlflow_run_id" in report["meta"] else ""))
        return 0
    finally:
        cleanup()
