"""``launch/compare.py``: every method through the same trainer, budget and evaluation; one table, two figures.

    python launch/compare.py [--setting quickstart] [--methods all] [--seeds 3] [--baseline-seeds 1]
        [--steps 300] [--nproc 2] [--out DIR] [--quick] [--protocol paper] [--no-mlflow] [key=value ...]

For each (method, seed): ``torchrun launch/train.py`` with the setting's config (``configs/<setting>.yaml`` for
Hypersolid, ``configs/baselines/<method>_<setting>.yaml`` where a method has one, else the setting's config with
``method.name=<method>``: ``plan.setting_config``), the seed and ``max_steps=--steps``; then
``launch/eval.py`` on its final checkpoint (kNN, linear probe, clustering, geometry; backbone features). Then
``<out>/compare.md`` / ``compare.json`` (mean ± std over seeds), ``dbscan_nmi_vs_eps.png`` and
``metrics.png``. MLflow: one parent run (the table's numbers, the files) with one child run per training (the
training's own run, which its evaluation also logs into). The study engine (``hypersolid_scale.study``) runs
the trainings and evaluations; starting it again on the same ``--out`` resumes (``compare.study``). Exit 0 when
every training and evaluation succeeded, 1 when some failed (the table holds the others), 2 for bad input.

The default evaluation (and ``--quick``) is the quick smoke comparison. ``--protocol paper`` evaluates every
checkpoint with ``launch/eval.py --protocol paper`` instead (docs/replication.md: backbone and projector, raw
and centred, kNN@5 and @20, every HDBSCAN setting, AMI), and the table's columns are the protocol's
(``table.PROTOCOL_COLUMNS``).
"""

from __future__ import annotations

import argparse
import json
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hypersolid_scale.compare import figures, table
from hypersolid_scale.compare.plan import Budget, Training, check_budget, parse_methods, plan, roles
from hypersolid_scale.compare.study import CompareStudy
from hypersolid_scale.safety.errors import UserError
from hypersolid_scale.safety.run_lock import RunDirLocked, acquire_run_lock
from hypersolid_scale.study import Engine, StudyState
from hypersolid_scale.tracking import TrackingConfig, make_tracker

EXPERIMENT = "compare"
STOP_GRACE_S = 300  # a stopped comparison waits this long for its child's checkpoint, then kills it
# --quick: every method, two seeds where several are asked for (so that mean ± std is exercised), a few
# steps, the evaluation on a subset: minutes, for CI and for trying the command.
QUICK = {"steps": 6, "seeds": 2, "baseline_seeds": 1, "eval_samples": 1000}


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Train every method at a matched budget (same images seen) with several "
        "seeds, evaluate each the same way, and write the comparison."
    )
    p.add_argument(
        "--setting",
        default="quickstart",
        help="configs/<setting>.yaml, and configs/baselines/<method>_<setting>.yaml where a method has one "
        "(default: quickstart)",
    )
    p.add_argument("--methods", default="all", help="comma-separated methods, or all (default)")
    p.add_argument(
        "--subject",
        default="hypersolid",
        help="the method under study: --seeds seeds and the thicker line in the figures (default hypersolid)",
    )
    p.add_argument(
        "--references",
        default="simclr",
        help="comma-separated methods that get --seeds seeds too, as the subject does (default simclr; '' none)",
    )
    p.add_argument("--seeds", type=int, default=3, help="seeds of the subject and the references (default 3)")
    p.add_argument("--baseline-seeds", type=int, default=1, help="seeds of the other methods (default 1)")
    p.add_argument("--steps", type=int, default=300, help="optimizer steps of every training (default 300)")
    p.add_argument("--nproc", type=int, default=2, help="processes per training (torchrun; default 2)")
    p.add_argument(
        "--eval-samples",
        type=int,
        default=None,
        help="evaluate on a seeded subset of this many images per split (default: all)",
    )
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="evaluation device")
    p.add_argument(
        "--out",
        default=None,
        help="output directory (default runs/compare-<setting>-<time>); an existing one is resumed",
    )
    p.add_argument("--configs", default=None, help="the configs folder (default: the repository's configs/)")
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"quick smoke comparison ({QUICK} unless given); for the protocol use --protocol paper",
    )
    p.add_argument(
        "--protocol",
        default=None,
        metavar="NAME",
        help="evaluate every checkpoint with launch/eval.py --protocol NAME (paper: docs/replication.md) "
        "instead of the quick suites (kNN@20, one HDBSCAN setting)",
    )
    p.add_argument("--no-mlflow", action="store_true", help="track nothing")
    p.add_argument("overrides", nargs="*", help="key=value overrides for every training (e.g. data.path=...)")
    args = p.parse_intermixed_args(list(argv))
    if args.quick:
        for key, value in QUICK.items():
            flag = f"--{key.replace('_', '-')}"
            if not any(a == flag or a.startswith(flag + "=") for a in argv):
                setattr(args, key, value)
    return args


def _header(args: argparse.Namespace, budget: Budget, trainings: list[Training]) -> str:
    return (
        f"# Comparison: {args.setting}, {budget.steps} steps x global batch {budget.global_batch} = "
        f"{budget.images_seen} images seen per training, {len(trainings)} trainings on {args.nproc} "
        f"process(es) each; evaluation "
        + (f"with --protocol {args.protocol}" if args.protocol else "on backbone features")
        + (f" of {args.eval_samples} images per split" if args.eval_samples else "")
        + "."
    )


def _collect(
    study: CompareStudy, state: StudyState, trainings: list[Training], budget: Budget
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, dict[str, Any]]]:
    reports: dict[str, list[dict[str, Any]]] = {}
    info: dict[str, dict[str, Any]] = {}
    for t in trainings:
        report = study.eval_dir(t) / "report.json"
        if not (state.eval_done(t.name, study.eval_key(t)) and report.exists()):
            continue
        reports.setdefault(t.method, []).append(json.loads(report.read_text()))
        i = info.setdefault(
            t.method,
            {
                "seeds": 0,
                "images_seen": budget.images_seen,
                "views": budget.views[t.method],
                "train_s": [],
                "eval_s": [],
            },
        )
        i["seeds"] += 1
        i["train_s"].append(state.run(t.name).get("train_s", 0.0))
        i["eval_s"].append(state.run(t.name).get("eval_s", 0.0))
    return reports, info


class _Terminated(KeyboardInterrupt):
    """SIGTERM, unwound like Ctrl-C (``run_cli`` reports it and exits 130)."""


def _terminated(signum: int, frame: object) -> None:
    raise _Terminated


def main(argv: Sequence[str], repo: Path) -> int:
    args = parse_args(argv)
    methods = parse_methods(args.methods)
    out = Path(args.out or f"runs/compare-{args.setting}-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    configs = Path(args.configs).resolve() if args.configs else repo / "configs"
    full = roles(args.subject, args.references)
    trainings = plan(configs, args.setting, methods, args.seeds, args.baseline_seeds, args.overrides, full=full)
    budget = check_budget(trainings, steps=args.steps, nproc=args.nproc, out_dir=out)
    if args.protocol is not None:  # refused before anything trains, not at each evaluation
        from hypersolid_scale.eval.protocol import get_protocol  # torch, FAISS: only when asked for

        try:
            get_protocol(args.protocol)
        except KeyError as err:
            raise UserError(f"--protocol: {err.args[0]}") from None
    if args.eval_samples is not None and args.eval_samples < 1:
        raise UserError(f"--eval-samples {args.eval_samples}: it must be >= 1 (or left out for all images)")
    try:
        lock = acquire_run_lock(out)  # one comparison per output directory
    except RunDirLocked as err:
        raise UserError(
            f"--out {out} is in use by another comparison ({err.holder}); wait for it to finish, "
            "stop it (kill that pid; its lock is released), or pass another --out"
        ) from None
    state = StudyState(out / "state.json")
    tracker = None
    tracking = ["tracking.enabled=false"]
    if not args.no_mlflow:
        cfg = TrackingConfig(
            tracking_uri=f"sqlite:///{out}/mlflow.db", experiment=EXPERIMENT, run_name=f"compare-{args.setting}"
        )
        tracker = make_tracker(
            cfg,
            out,
            rank=0,
            resume_run_id=state.data.get("parent_run_id"),
            tags={"kind": "compare", "setting": args.setting},
        )
        state.data["parent_run_id"] = tracker.run_id
        state.save()
        tracking = [
            f"tracking.tracking_uri={cfg.tracking_uri}",
            f"tracking.experiment={EXPERIMENT}",
            f"tracking.parent_run_id={tracker.run_id}",
        ]
    # The quick suites' K; the protocol sets its own evaluation settings (kNN at K = 5 and 20, ...).
    evals = ["eval.batch_size=1000"] if args.protocol else ["eval.knn_k=[20]", "eval.batch_size=1000"]
    if args.eval_samples:
        evals += [f"eval.max_train_samples={args.eval_samples}", f"eval.max_test_samples={args.eval_samples}"]
    study = CompareStudy(
        out, repo, args.steps, args.nproc, tracking, evals, not args.no_mlflow, args.device, args.protocol
    )
    columns = table.PROTOCOL_COLUMNS if args.protocol else table.QUICK_COLUMNS
    header = _header(args, budget, trainings)
    print(header + f"\noutput: {out} (logs in {out / 'logs'})", flush=True)
    status = "FAILED"
    # SIGTERM (a scheduler's stop): unwind so that the parent run is closed KILLED; the running child gets
    # SIGTERM and is waited for while it checkpoints (the engine's stop, STOP_GRACE_S).
    signal.signal(signal.SIGTERM, _terminated)
    try:
        engine = Engine(study, state, slots=1, grace_s=STOP_GRACE_S, cwd=repo)
        engine.run(trainings)
        failures = engine.failures
        reports, info = _collect(study, state, trainings, budget)
        summary = table.summarise(reports, columns)
        js, md = table.write(out, summary, info, table.skipped_reasons(reports, columns), header, columns)
        title = f"{args.setting}: {budget.images_seen} images seen per training"
        pngs = [
            p
            for p in (
                figures.plot_dbscan(reports, out / "dbscan_nmi_vs_eps.png", title, subject=args.subject),
                figures.plot_bars(summary, out / "metrics.png", title, columns),
            )
            if p is not None
        ]
        print("\n" + md.read_text().split("\n", 2)[2])
        if tracker is not None:
            tracker.log_params(
                {
                    "setting": args.setting,
                    "steps": args.steps,
                    "global_batch": budget.global_batch,
                    "images_seen": budget.images_seen,
                    "seeds": args.seeds,
                    "baseline_seeds": args.baseline_seeds,
                    "subject": args.subject,
                    "references": args.references,
                    "methods": ",".join(methods),
                    "eval_samples": args.eval_samples or "all",
                    "eval_protocol": args.protocol or "quick",
                }
            )
            tracker.log_metrics(
                {
                    f"{m}.{k}_{stat}": v
                    for m, cols in summary.items()
                    for k, s in cols.items()
                    for stat, v in (("mean", s.mean), ("std", s.std))
                    if v is not None
                },
                step=0,
            )
            for path in (js, md, *pngs):
                tracker.log_artifact(path)
        for name, error in failures.items():
            print(f"FAILED {name}: {error}")
        print(f"table: {md}\nfigures: {', '.join(str(p) for p in pngs) or 'none'}")
        status = "FINISHED" if not failures else "FAILED"
        return 0 if not failures else 1
    except (KeyboardInterrupt, _Terminated):
        status = "KILLED"
        raise
    finally:
        if tracker is not None:
            tracker.close(status)
        lock.release()
