"""What one run's result JSON holds (``<out>/<group>/<run>.json``): the run's plan, its commands, the machine,
its times, every evaluation with the training's own epoch means beside it; made from the study engine's
progress of the run (its evaluations and its record in the state file) once they are all done."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from hypersolid_scale.study.protocol import RunProgress
from hypersolid_scale.training.epoch_records import EPOCHS_FILE, read_epochs

TRAIN_IDS = ("epoch", "step")  # an epoch record's keys that are not statistics (``steps`` is kept: its weight)


def _entries(prog: RunProgress) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]], list[str]]:
    """The run's evaluations as result entries (one per evaluated checkpoint and protocol), its HDBSCAN diagnosis
    by feature kind ({"step", "eval_s", "rows" (eval/hdbscan_grid.py's), "skipped"}) and the first evaluation's
    command."""
    entries: list[dict[str, Any]] = []
    diagnosis: dict[str, dict[str, Any]] = {}
    eval_cmd: list[str] = []
    for ev, report, seconds in prog.evaluated.values():
        if ev.protocol.startswith("hdbscan_grid."):  # the diagnosis: its rows, kept apart from the evaluations
            kind = ev.protocol.split(".", 1)[1]
            diagnosis[kind] = {"step": ev.step, "eval_s": round(seconds, 2), "rows": report.get("hdbscan_grid")}
            diagnosis[kind]["skipped"] = report.get("skipped", {})
            continue
        eval_cmd = eval_cmd or list(ev.cmd)
        entry = {"epoch": ev.epoch, "step": ev.step, "protocol": ev.protocol, "eval_s": round(seconds, 2)}
        entry["bank"] = (report.get("eval_config") or {}).get("max_train_samples")  # kNN's memory bank (None: all)
        entries.append({**entry, **report.get("metrics", {}), "skipped_metrics": report.get("skipped", [])})
    return entries, diagnosis, eval_cmd


def run_result(st: RunProgress, run_dir: Path, facts: tuple[str, str, str]) -> dict[str, Any]:
    """The result of a run whose evaluations are all done (``run_dir``: its trainer's; ``facts``: card, torch,
    git commit)."""
    done = st.record
    entries, diagnosis, eval_cmd = _entries(st)
    # The training's own epoch means (the trainer's epochs.jsonl: loss terms, active pairs), every epoch,
    # and beside each evaluation of an epoch's end the means of that epoch (``train.<statistic>``).
    trained = read_epochs(run_dir / EPOCHS_FILE)
    per_epoch = sorted(
        (
            {**e, **{f"train.{k}": v for k, v in trained.get(int(e["epoch"]), {}).items() if k not in TRAIN_IDS}}
            if float(e["epoch"]).is_integer()
            else e
            for e in entries
        ),
        key=lambda e: e["epoch"],
    )
    return {
        "run": st.run.name,
        # False for a staged run's result so far (paused after ``trained_to_epoch``): the driver trains it on.
        "complete": not st.stage_epoch,
        **({"trained_to_epoch": st.stage_epoch} if st.stage_epoch else {}),
        **{k: getattr(st.run, k) for k in ("method", "seed", "group", "part", "epochs", "config")},
        "overrides": list(st.run.overrides),
        "command": shlex.join(st.train_cmd),
        "eval_command": shlex.join(eval_cmd),
        **dict(zip(("card", "torch", "git_commit"), facts)),
        # This invocation's seconds; train_s_total is the training's last (possibly resumed) attempt, and
        # train_s_attempts the sum over every attempt (the engine's state file; absent from older runs).
        "wall_s": round(st.train_s + st.eval_s, 2),
        "train_s": round(st.train_s, 2),
        "eval_s": round(st.eval_s, 2),
        "train_s_total": done.get("last_attempt_s"),
        "train_s_attempts": done.get("train_s"),
        # Threads per process over the attempts (OMP_NUM_THREADS; absent from older runs): a CPU run's weights
        # depend on it, so two runs are comparable bit for bit only at one count.
        "threads": done.get("threads"),
        **{k: done.get(k) for k in ("final_step", "resumed_from_step")},
        "per_epoch": per_epoch,
        "final": per_epoch[-1] if per_epoch else {},
        "train_per_epoch": list(trained.values()),
        **({"hdbscan_grid": diagnosis} if diagnosis else {}),
    }


def best_knn(result: dict[str, Any]) -> str:
    """The best kNN metric of the final evaluation, for the driver's one line per finished run: the suite's keys
    (knn_k20_weighted) or the protocol's (protocol.backbone.raw.knn_k20_weighted)."""
    knn = {
        k: v
        for k, v in result["final"].items()
        if k.removeprefix("protocol.backbone.raw.").startswith("knn") and isinstance(v, float)
    }
    return f"{max(knn, key=lambda k: knn[k])}={max(knn.values()):.4f}" if knn else "no kNN metric"
