"""What one run's result JSON holds (``<out>/<group>/<run>.json``): the run's plan, its commands, the machine,
its times, every evaluation with the training's own epoch means beside it. The driver (run.py) fills a
:class:`State` per run as its trainings and evaluations finish."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.replication.runfiles import read_json
from benchmarks.replication.runspec import Run
from hypersolid_scale.training.epoch_records import EPOCHS_FILE, read_epochs

TRAIN_IDS = ("epoch", "step")  # an epoch record's keys that are not statistics (``steps`` is kept: its weight)


@dataclass
class State:
    """One run's progress in this invocation."""

    run: Run
    home: Path
    train_cmd: list[str]
    train_s: float = 0.0
    eval_s: float = 0.0
    pending: int = 0
    entries: list[dict[str, Any]] = field(default_factory=list)
    # The HDBSCAN diagnosis by feature kind: {"step", "eval_s", "rows" (eval/hdbscan_grid.py's), "skipped"}
    diagnosis: dict[str, dict[str, Any]] = field(default_factory=dict)
    stage_epoch: int = 0  # a staged run paused after this epoch (its result so far); 0: trained to the end
    eval_cmd: list[str] = field(default_factory=list)


def run_result(st: State, facts: tuple[str, str, str]) -> dict[str, Any]:
    """The result of a run whose evaluations are all done (``facts``: card, torch, git commit)."""
    done = read_json(st.home / "train_done.json") or {}
    # The training's own epoch means (the trainer's epochs.jsonl: loss terms, active pairs), every epoch,
    # and beside each evaluation of an epoch's end the means of that epoch (``train.<statistic>``).
    trained = read_epochs(st.home / "run" / EPOCHS_FILE)
    per_epoch = sorted(
        (
            {**e, **{f"train.{k}": v for k, v in trained.get(int(e["epoch"]), {}).items() if k not in TRAIN_IDS}}
            if float(e["epoch"]).is_integer()
            else e
            for e in st.entries
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
        "eval_command": shlex.join(st.eval_cmd),
        **dict(zip(("card", "torch", "git_commit"), facts)),
        # This invocation's seconds; train_s_total is the training's last (possibly resumed) attempt, and
        # train_s_attempts the sum over every attempt (run.py's attempts.json; absent from older runs).
        "wall_s": round(st.train_s + st.eval_s, 2),
        "train_s": round(st.train_s, 2),
        "eval_s": round(st.eval_s, 2),
        "train_s_total": done.get("train_s"),
        "train_s_attempts": done.get("train_s_attempts"),
        **{k: done.get(k) for k in ("final_step", "resumed_from_step")},
        "per_epoch": per_epoch,
        "final": per_epoch[-1] if per_epoch else {},
        "train_per_epoch": list(trained.values()),
        **({"hdbscan_grid": st.diagnosis} if st.diagnosis else {}),
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
