"""``launch/eval.py``: evaluate a checkpoint on its dataset, print a table, write a report, log to MLflow.

    python launch/eval.py --checkpoint runs/quickstart/checkpoints/step_00001407.pt \
        [--suite knn,linear,cluster,geometry,plots,qualitative] [--features backbone|projector] \
        [--output-dir DIR] [--device auto|cpu|cuda] [--no-mlflow] [data.key=value eval.key=value ...]
    python launch/eval.py --checkpoint PATH --protocol paper [--output-dir DIR] [...]
    python launch/eval.py --backbone torchvision:resnet50 --weights r50.pth [--strip-prefix P] \
        data.format=imagefolder data.path=... [--suite ...] [--output-dir DIR] [...]

A published backbone (``--backbone SOURCE:NAME --weights FILE``, ``hypersolid_scale.models.external``) is
evaluated on its pooled features with the same suites, on the data of the data.* overrides (the config is
the defaults plus the overrides); its report goes to ``<dirname(FILE)>/eval/<stem>``, its MLflow run is a
new one tagged ``eval.kind=external``.

``--protocol paper`` runs the replication protocol (``hypersolid_scale.eval.protocol``, docs/replication.md)
instead of ``--suite``: both feature kinds, raw and centred, every grid value, flat ``protocol.*`` keys.

Steps: load the checkpoint and rebuild its model -> embed the train and test splits with the eval
transform (sharded over ranks under torchrun, cached on disk) -> on rank 0, run the chosen suites on
the cached features (and the qualitative suite on ``eval.qualitative_images`` test images through the
model) -> ``report.json``, ``report.md`` and PNGs in the output directory -> MLflow: the training run
recorded in the checkpoint when it can be found, else a new run tagged with the checkpoint.

A metric that cannot run on this data is skipped with a warning and listed with its reason in the report
(``hypersolid_scale.eval.suites``); the exit status is 0 unless every requested metric was skipped
(``EXIT_NOTHING_EVALUATED``). Bad input (missing or corrupt checkpoint, weights of another architecture,
an unknown or model-changing override, missing evaluation data) raises a ``UserError`` whose message says
what to fix; ``cli`` (behind ``launch/eval.py``) prints it as one line and exits 2, and appends the
traceback to ``<output dir>/errors.log``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import Dataset

from hypersolid_scale.eval.config import EMBEDDING_SUITES, FEATURES, SUITES, EvalConfig
from hypersolid_scale.eval.embed import cached_embeddings, embedding_fingerprint
from hypersolid_scale.eval.inputs import capped, eval_datasets, sample_images
from hypersolid_scale.eval.mlflow_log import log_to_mlflow
from hypersolid_scale.eval.report import format_table, write_report
from hypersolid_scale.eval.source import Source, checkpoint_source, external_source
from hypersolid_scale.eval.suites import Split, nothing_evaluated, run_suites
from hypersolid_scale.safety.errors import ConfigError, run_cli

if TYPE_CHECKING:
    from hypersolid_scale.eval.protocol import Protocol

__all__ = ["cli", "default_output_dir", "main", "parse_args"]

# Exit status when every requested metric was skipped (the report is still written, with the reasons).
EXIT_NOTHING_EVALUATED = 3
ERROR_LOG = "errors.log"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Evaluate a Hypersolid checkpoint or a published backbone (kNN, linear "
        "probe, clustering, geometry, plots, qualitative figures)."
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", help="path to a step_*.pt file (or a sharded step_*.dcp folder)")
    source.add_argument(
        "--backbone",
        help="a published backbone, SOURCE:NAME with SOURCE torchvision, timm or "
        "native (this package's backbones; e.g. torchvision:resnet50), evaluated with --weights",
    )
    p.add_argument("--weights", help="--backbone's weights: a state dict, or a checkpoint holding one")
    p.add_argument(
        "--strip-prefix",
        action="append",
        default=[],
        metavar="PREFIX",
        help="--weights: also strip this prefix from the tensor names (repeatable)",
    )
    p.add_argument(
        "--suite",
        default=None,
        help=f"comma-separated subset of {','.join(SUITES)} (default: "
        "eval.suites, which leaves out the slow qualitative suite)",
    )
    p.add_argument("--features", default=None, choices=FEATURES, help="default: eval.features (backbone)")
    p.add_argument(
        "--protocol",
        default=None,
        metavar="NAME",
        help="run a fixed evaluation protocol instead of --suite/--features: paper (docs/replication.md)",
    )
    p.add_argument(
        "--output-dir",
        default=None,
        help="default: <run_dir>/eval/<checkpoint name>, <dirname(weights)>/eval/<weights name>",
    )
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")
    p.add_argument("overrides", nargs="*", help="data.key=value / eval.key=value / tracking.key=value")
    # Intermixed: overrides may come before, between and after the options.
    return p.parse_intermixed_args(None if argv is None else list(argv))


# ----------------------------------------------------------------------------------------------------------
# Evaluation data and the output directory
# ----------------------------------------------------------------------------------------------------------


def default_output_dir(checkpoint: Path, *, external: bool = False) -> Path:
    """``<run_dir>/eval/<step_x>`` for checkpoints inside ``<run_dir>/checkpoints``, else next to the file;
    ``<dirname(weights)>/eval/<stem>`` for the weights of a published backbone."""
    if external:
        return checkpoint.parent / "eval" / checkpoint.stem
    from hypersolid_scale.checkpoint import run_dir_of

    run_dir = run_dir_of(checkpoint)
    if run_dir is not None:
        return run_dir / "eval" / checkpoint.stem
    return checkpoint.parent / f"eval_{checkpoint.stem}"


# ----------------------------------------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None, *, on_output_dir: Callable[[Path], None] | None = None) -> int:
    """Evaluate; ``on_output_dir`` learns the output directory as soon as it is known to be the right one."""
    from hypersolid_scale.distributed import cleanup, init_distributed

    args = parse_args(argv)
    proto = _protocol(args)
    src, out_dir = _open(args, proto, on_output_dir)
    ev = _settings(args, src)
    info, device = init_distributed(device=args.device)
    try:
        src.model.to(device)
        full = dict(zip(("train", "test"), eval_datasets(src.cfg, None if args.backbone else src.path)))
        caps = {"train": ev.max_train_samples, "test": ev.max_test_samples}
        data = {split: capped(ds, caps[split], ev.seed) for split, ds in full.items()}
        kinds = [k for k in proto.features if k == "backbone" or _has_projector(src)] if proto else [ev.features]
        t0 = time.perf_counter()
        by_kind: dict[str, dict[str, Split]] = {}
        if proto or any(s in EMBEDDING_SUITES for s in ev.suites):  # the qualitative suite alone needs no embeddings
            by_kind = {k: _embed(src, data, full, ev, device, verbose=info.rank == 0, which=k) for k in kinds}
        embed_s = time.perf_counter() - t0
        if info.rank != 0:
            return 0
        report = _evaluate(src, ev, proto, data, by_kind, out_dir, device)
        splits = by_kind.get(kinds[0], {})
        report["timings_s"] = {**({"embed": embed_s} if splits else {}), **report["timings_s"]}
        _describe(report, src, ev, proto, data, kinds, splits, info.world_size)
        write_report(report, out_dir)
        if not args.no_mlflow and src.cfg.tracking.enabled:
            log_to_mlflow(report, src, out_dir)
            write_report(report, out_dir)  # now with the MLflow run id
        return _print_result(report, src, ev, proto, kinds, bool(splits), out_dir)
    finally:
        cleanup()


def _open(
    args: argparse.Namespace, proto: Protocol | None, on_output_dir: Callable[[Path], None] | None
) -> tuple[Source, Path]:
    """The checkpoint's (or published backbone's) model and config with the overrides, and the output directory
    (told to ``on_output_dir`` once it is known to be the right one)."""
    if (args.backbone is None) != (args.weights is None) or (args.strip_prefix and args.backbone is None):
        raise ConfigError(
            "--weights and --strip-prefix go with --backbone, and --backbone needs --weights: pass "
            "--backbone SOURCE:NAME --weights FILE, or --checkpoint FILE alone"
        )
    path = Path(args.checkpoint or args.weights)
    out_dir = Path(args.output_dir) if args.output_dir else default_output_dir(path, external=bool(args.backbone))
    if on_output_dir is not None and (args.output_dir or path.exists()):  # no folders for a mistyped path
        on_output_dir(out_dir)
    # The protocol's settings come first: an explicit eval.key=value still wins (e.g. a smaller subset).
    overrides = [*(proto.overrides if proto else ()), *args.overrides]
    src = (
        external_source(args.backbone, path, args.strip_prefix, overrides)
        if args.backbone
        else checkpoint_source(path, overrides)
    )
    return src, out_dir


def _settings(args: argparse.Namespace, src: Source) -> EvalConfig:
    """The eval section with --suite and --features applied, validated."""
    ev: EvalConfig = src.cfg.eval
    if args.suite is not None:
        ev.suites = [s.strip() for s in args.suite.split(",") if s.strip()]
    if args.features is not None:
        ev.features = args.features
    ev.validate()
    if args.backbone and (ev.features != "backbone" or "qualitative" in ev.suites):
        raise ConfigError(
            "--backbone has no projector and no figures of its own: evaluate its backbone features "
            "(drop --features projector) and leave the qualitative suite out of --suite"
        )
    if ev.features == "projector" and not _has_projector(src):
        raise ConfigError(
            f"--features projector: this checkpoint holds no projection head (method.name={src.cfg.method.name}, "
            "its method state absent or the method without one); evaluate its backbone (--features backbone)"
        )
    return ev


def _evaluate(
    src: Source,
    ev: EvalConfig,
    proto: Protocol | None,
    data: dict[str, Dataset],
    by_kind: dict[str, dict[str, Split]],
    out_dir: Path,
    device: torch.device,
) -> dict[str, Any]:
    """The report of the protocol on every feature kind, or of the chosen suites on the first."""
    if proto:
        # The exclusion zone at the checkpoint's own alpha (Hypersolid's), the protocol's default for other methods.
        section = getattr(src.cfg.method, src.cfg.method.name, None)
        alpha = float(getattr(section, "alpha", proto.default_alpha))
        pairs = {k: (s["train"], s["test"]) for k, s in by_kind.items()}
        from hypersolid_scale.eval.protocol import run_protocol  # its clustering stack: only when it runs

        return run_protocol(pairs, ev, proto, out_dir, alpha=alpha, device=device, log=print)
    splits = next(iter(by_kind.values()), {})
    images = (
        sample_images(data["test"], src.cfg, ev.qualitative_images, ev.seed) if "qualitative" in ev.suites else None
    )
    return run_suites(
        splits.get("train"), splits.get("test"), ev, out_dir, device=device, model=src.model, images=images
    )


def _describe(
    report: dict[str, Any],
    src: Source,
    ev: EvalConfig,
    proto: Protocol | None,
    data: dict[str, Dataset],
    kinds: list[str],
    splits: dict[str, Split],
    world_size: int,
) -> None:
    """The report's ``meta`` (what was evaluated, on what) and ``eval_config``."""
    sizes = {"n_train": len(data["train"]), "n_test": len(data["test"])}  # type: ignore[arg-type]
    report["meta"] = {
        **src.meta,
        "dataset": src.cfg.data.describe(),
        "features": ",".join(kinds),
        **({"protocol": proto.name} if proto else {}),
        "feature_dim": int(splits["train"][0].shape[1]) if splits else None,
        **sizes,
        "suites": list(ev.suites),
        "world_size": world_size,
    }
    report["eval_config"] = asdict(ev)


def _print_result(
    report: dict[str, Any],
    src: Source,
    ev: EvalConfig,
    proto: Protocol | None,
    kinds: list[str],
    embedded: bool,
    out_dir: Path,
) -> int:
    """The table, the figures and the report's paths; the exit status (EXIT_NOTHING_EVALUATED when every
    metric was skipped)."""
    meta = report["meta"]
    title = (
        f"{src.label}, {src.cfg.data.describe()}, "
        + (f"{'+'.join(kinds)} features, " if embedded else "")
        + f"n_train={meta['n_train']}, n_test={meta['n_test']})"
    )
    if proto:
        from hypersolid_scale.eval.protocol import summary

        shown = summary(report["metrics"])
    else:
        shown = report["metrics"]
    print(format_table(shown, title=title, skipped=report["skipped"]))
    for name, png in report.get("qualitative", {}).items():
        print(f"[eval] qualitative {name}: {png}")
    print(
        f"[eval] report: {out_dir / 'report.json'}, {out_dir / 'report.md'}"
        + (f"; MLflow run {meta['mlflow_run_id']}" if "mlflow_run_id" in meta else "")
    )
    if nothing_evaluated(report):
        print(
            f"[eval] error: nothing could be evaluated: every metric of the suites {list(ev.suites)} was "
            f"skipped on this data (reasons above and in {out_dir / 'report.md'}); choose other suites or "
            "eval.* settings",
            file=sys.stderr,
        )
        return EXIT_NOTHING_EVALUATED
    return 0


def _embed(
    src: Source,
    data: dict[str, Dataset],
    full: dict[str, Dataset],
    ev: EvalConfig,
    device: torch.device,
    *,
    verbose: bool,
    which: str,
) -> dict[str, Split]:
    """{split: (``which`` features, labels)} of the (capped) datasets, from the on-disk cache when it holds them."""
    cache_dir = Path(ev.cache_dir) if ev.cache_dir else src.home / "eval_cache"
    data_dict = asdict(src.cfg.data)
    splits: dict[str, Split] = {}
    for split, ds in data.items():
        # A subset is drawn with eval.seed, so the seed joins the cache key (which holds the sample count).
        key = data_dict if ds is full[split] else {**data_dict, "eval_subset_seed": ev.seed}
        fp = embedding_fingerprint(src.weights_id, key, split, which, len(ds))  # type: ignore[arg-type]
        x, y, hit = cached_embeddings(
            src.model,
            ds,
            cache_dir=cache_dir,
            fingerprint=fp,
            batch_size=ev.batch_size,
            device=device,
            which=which,
            num_workers=ev.num_workers,
            desc=f"embed {split}",
        )
        splits[split] = (x, y)
        if verbose:
            print(f"[eval] {split}: {tuple(x.shape)} {which} features ({'cache' if hit else 'extracted'})")
    return splits


def _has_projector(src: Source) -> bool:
    """A model with its method's projection head (a published backbone, a checkpoint without its method's
    state, or a method without a head has none): the protocol's projector features and exclusion zone are
    measured on it."""
    return getattr(src.model, "projector", None) is not None


def _protocol(args: argparse.Namespace) -> Protocol | None:
    """The protocol of ``--protocol``; a ``ConfigError`` for an unknown name or a clash with --suite/--features."""
    if args.protocol is None:
        return None
    from hypersolid_scale.eval.protocol import get_protocol  # scikit-learn and HDBSCAN: only for --protocol

    try:
        proto = get_protocol(args.protocol)
    except KeyError as err:
        raise ConfigError(f"--protocol: {err.args[0]}") from None
    if args.suite is not None or args.features is not None:
        raise ConfigError(f"--protocol {proto.name} fixes the metrics and features: drop --suite and --features")
    return proto


def cli(argv: Sequence[str]) -> int:
    """``main`` for ``launch/eval.py``: bad input is one line and exit 2, a bug one line and exit 1; the
    traceback goes to ``<output dir>/errors.log`` once that directory is known (and to stderr with HS_DEBUG=1)."""
    log: list[Path] = []
    return run_cli(
        lambda a: main(a, on_output_dir=lambda d: log.append(d / ERROR_LOG)),
        argv,
        log_file=lambda: log[-1] if log else None,
    )


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
