"""``launch/eval.py``: evaluate a checkpoint on its dataset, print a table, write a report, log to MLflow.

    python launch/eval.py --checkpoint runs/quickstart/checkpoints/step_00001407.pt \
        [--suite knn,linear,cluster,geometry,plots] [--features backbone|projector] \
        [--output-dir DIR] [--device auto|cpu|cuda] [--no-mlflow] [data.key=value eval.key=value ...]

Steps: load the checkpoint and rebuild its model -> embed the train and test splits with the eval
transform (sharded over ranks under torchrun, cached on disk) -> on rank 0, run the chosen suites on
the cached features -> ``report.json``, ``report.md`` and PNGs in the output directory -> MLflow: the
training run recorded in the checkpoint when it can be found, else a new run tagged with the checkpoint.

A metric that cannot run on this data is skipped with a warning and listed with its reason in the report
(``hypersolid_scale.eval.suites``); the exit status is 0 unless every requested metric was skipped
(``EXIT_NOTHING_EVALUATED``). Bad input (missing or corrupt checkpoint, weights of another architecture,
an unknown or model-changing override) is an exception with a message that says what to fix.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset, Subset

from hypersolid_scale.eval.clustering import subsample
from hypersolid_scale.eval.config import FEATURES, SUITES, EvalConfig
from hypersolid_scale.eval.embed import cached_embeddings, embedding_fingerprint, file_fingerprint
from hypersolid_scale.eval.report import format_table, write_report
from hypersolid_scale.eval.suites import nothing_evaluated, run_suites

__all__ = ["default_output_dir", "load_model", "main", "parse_args", "run_suites"]

# Exit status when every requested metric was skipped (the report is still written, with the reasons).
EXIT_NOTHING_EVALUATED = 3

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


def capped(ds: Dataset, max_n: int | None, seed: int) -> Dataset:
    """A seeded random subset of at most ``max_n`` samples (a random one: datasets may be sorted by class)."""
    n = len(ds)  # type: ignore[arg-type]
    if max_n is None or n <= max_n:
        return ds
    return Subset(ds, subsample(n, max_n, seed).tolist())


def default_output_dir(checkpoint: Path) -> Path:
    """``<run_dir>/eval/<step_x>`` for checkpoints inside ``<run_dir>/checkpoints``, else next to the file."""
    if checkpoint.parent.name == "checkpoints":
        return checkpoint.parent.parent / "eval" / checkpoint.stem
    return checkpoint.parent / f"eval_{checkpoint.stem}"


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
    if report.get("skipped"):  # the reasons are in report.md/report.json; the tag makes skipped runs searchable
        tracker.set_tags({"eval.skipped": ", ".join(report["skipped"])[:5000]})
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
        full = dict(zip(("train", "test"), build_eval_datasets(cfg.data)))
        caps = {"train": ev.max_train_samples, "test": ev.max_test_samples}
        t0 = time.perf_counter()
        splits = {}
        for split, full_ds in full.items():
            ds = capped(full_ds, caps[split], ev.seed)
            # A subset is drawn with eval.seed, so the seed joins the cache key (which holds the sample count).
            key = data_dict if ds is full_ds else {**data_dict, "eval_subset_seed": ev.seed}
            fp = embedding_fingerprint(ckpt_fp, key, split, ev.features, len(ds))
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
        print(format_table(report["metrics"], title=title, skipped=report["skipped"]))
        print(f"[eval] report: {out_dir / 'report.json'}, {out_dir / 'report.md'}"
              + (f"; MLflow run {report['meta']['mlflow_run_id']}" if "mlflow_run_id" in report["meta"] else ""))
        if nothing_evaluated(report):
            print(f"[eval] error: nothing could be evaluated: every metric of the suites {list(ev.suites)} was "
                  f"skipped on this data (reasons above and in {out_dir / 'report.md'}); choose other suites or "
                  "eval.* settings", file=sys.stderr)
            return EXIT_NOTHING_EVALUATED
        return 0
    finally:
        cleanup()
