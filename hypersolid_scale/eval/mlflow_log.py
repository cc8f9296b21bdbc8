"""An evaluation's report logged to MLflow: into the training's run when the checkpoint names one that can be
found, else a new run tagged with what was evaluated (``eval.kind``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hypersolid_scale.eval.source import Source


def log_to_mlflow(report: dict[str, Any], src: Source, out_dir: Path) -> None:
    """Log metrics (``eval/<name>`` at the checkpoint's step) and artifacts; fill report["meta"] with the run."""
    from hypersolid_scale.tracking import make_tracker

    ckpt = src.ckpt
    tcfg = src.cfg.tracking
    if ckpt.get("tracking_uri"):
        tcfg.tracking_uri = ckpt["tracking_uri"]
    elif tcfg.tracking_uri is None:  # training was not tracked: keep the eval run next to the training run
        tcfg.tracking_uri = f"sqlite:///{src.home.resolve()}/mlflow.db"
    tracker = None
    attached = False
    if ckpt.get("mlflow_run_id"):
        try:
            tracker = make_tracker(
                tcfg, out_dir, rank=0, resume_run_id=ckpt["mlflow_run_id"], tags=src.tags, attach=True
            )
            attached = True
        except ValueError as err:
            print(f"[eval] training run not found ({err}); logging to a new MLflow run instead", file=sys.stderr)
    if tracker is None:
        tcfg.run_name = tcfg.run_name or f"eval-{src.path.stem}"
        tracker = make_tracker(tcfg, out_dir, rank=0, tags={**src.tags, "eval.kind": src.kind})
    step = int(ckpt.get("step", 0))
    numeric = {f"eval/{k}": float(v) for k, v in report["metrics"].items() if isinstance(v, (int, float))}
    tracker.log_metrics(numeric, step=step)
    if report.get("skipped"):  # the reasons are in report.md/report.json; the tag makes skipped runs searchable
        tracker.set_tags({"eval.skipped": ", ".join(report["skipped"])[:5000]})
    for r in report.get("dbscan", []):  # the sweep as a curve: x = eps in thousandths
        if r["nmi"] is not None:
            tracker.log_metrics(
                {"eval/dbscan_nmi_vs_eps": r["nmi"], "eval/dbscan_ari_vs_eps": r["ari"]},
                step=int(round(1000 * r["eps"])),
            )
    # The figures keep their place under the output directory (the qualitative ones may sit in a subfolder).
    for path in (out_dir / "report.json", out_dir / "report.md", *map(Path, report.get("plots", []))):
        try:
            sub = path.parent.relative_to(out_dir).as_posix()
        except ValueError:
            sub = "."
        tracker.log_artifact(path, artifact_path=f"eval/{src.path.stem}" + ("" if sub == "." else f"/{sub}"))
    # Attached to the training's run: its status is the training's (it may still be running).
    tracker.close(None if attached else "FINISHED")
    report["meta"].update(mlflow_run_id=tracker.run_id, tracking_uri=tracker.tracking_uri)
