"""The comparison to the study engine (``hypersolid_scale.study``): each training and its evaluation as the user's
own commands, where their files go, and when a training is done.

Each training is ``torchrun launch/train.py`` (``python launch/train.py`` on one process) and each evaluation
``launch/eval.py`` on its final checkpoint: the very commands a user runs, so the comparison exercises the trainer,
its checkpoints and its tracking, not a copy of them. Under ``<out>``: ``runs/<name>`` (the trainer's run
directory), ``eval/<name>/report.json``, ``results/<name>.json`` (the run's result),
``logs/<name>.{train,eval}.log`` and the engine's ``state.json`` (with the MLflow parent run). Started again on
the same output directory, a comparison resumes: a training whose final checkpoint exists is not run again, an
evaluation of that checkpoint with the same protocol is kept, an interrupted training resumes from its newest
checkpoint (the trainer's own resume), and the seconds already spent are kept in ``state.json``.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypersolid_scale.compare.plan import Training, training_overrides
from hypersolid_scale.safety import atomic
from hypersolid_scale.study.plan import Evaluation
from hypersolid_scale.study.protocol import RunProgress

# The quick smoke comparison's evaluation of every checkpoint: kNN at K=20 (the paper uses K=5 on small data sets:
# --protocol paper reports both), the linear probe, K-Means / DBSCAN eps sweep / HDBSCAN, and the geometry of the
# embedding, on backbone features.
EVAL_SUITES = "knn,linear,cluster,geometry"


@dataclass
class CompareStudy:
    """``repo`` holds ``launch/``; ``tracking`` are the overrides that put each training into the comparison's
    MLflow experiment, under its parent run; ``protocol``: ``launch/eval.py --protocol NAME`` instead of
    ``--suite EVAL_SUITES``."""

    out: Path
    repo: Path
    steps: int
    nproc: int
    tracking: list[str]
    eval_overrides: list[str]
    mlflow: bool
    device: str = "auto"
    protocol: str | None = None

    def run_dir(self, t: Training) -> Path:
        return self.out / "runs" / t.name

    def eval_dir(self, t: Training) -> Path:
        return self.out / "eval" / t.name

    def log(self, t: Training, stage: str) -> Path:
        return self.out / "logs" / f"{t.name}.{stage}.log"

    def train_log(self, t: Training) -> Path:
        return self.log(t, "train")

    def eval_log(self, t: Training, ev: Evaluation) -> Path:
        return self.log(t, "eval")

    def processes(self, t: Training) -> int:
        return self.nproc

    def final_checkpoint(self, t: Training) -> Path:
        from hypersolid_scale.checkpoint import checkpoint_path  # torch only when a checkpoint is looked for

        return checkpoint_path(self.run_dir(t), self.steps)

    def train_command(self, t: Training) -> list[str]:
        # One process: the trainer itself, without a torchrun agent around it (its start, ~3 s, buys nothing).
        launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={self.nproc}"]
        return [
            sys.executable,
            *(launcher if self.nproc > 1 else []),
            str(self.repo / "launch" / "train.py"),
            "--config",
            str(t.config),
            *training_overrides(t, steps=self.steps, run_dir=self.run_dir(t)),
            *self.tracking,
            f"tracking.run_name={t.name}",
        ]

    def eval_key(self, t: Training) -> str:
        """The evaluation's name in the state file: its checkpoint and what it measures (a report of the quick
        suites is not one of a protocol, nor one of another budget's checkpoint)."""
        return f"step_{self.steps:08d}_{self.protocol or 'quick'}"

    def evaluations(self, t: Training, final_step: int, upto: int | None) -> tuple[list[Evaluation], list[str]]:
        cmd = [
            sys.executable,
            str(self.repo / "launch" / "eval.py"),
            "--checkpoint",
            str(self.final_checkpoint(t)),
            "--output-dir",
            str(self.eval_dir(t)),
            *(["--protocol", self.protocol] if self.protocol else ["--suite", EVAL_SUITES]),
            "--device",
            self.device,
            *([] if self.mlflow else ["--no-mlflow"]),
            *self.eval_overrides,
        ]
        ev = Evaluation(self.eval_key(t), tuple(cmd), self.eval_dir(t), self.steps, protocol=self.protocol or "quick")
        return [ev], []

    def is_trained(self, t: Training, record: dict[str, Any]) -> bool:
        return self.final_checkpoint(t).exists()  # whatever the state says: the budget's checkpoint is the result

    def is_finished(self, t: Training) -> bool:
        return False  # the table is made from every run's report each time: each is looked at (cheaply) again

    def trained_error(self, t: Training, final_step: int) -> str | None:
        if self.final_checkpoint(t).exists():
            return None
        return (
            f"training ended before step {self.steps} (no {self.final_checkpoint(t).name}): "
            "its epochs end first; pass epochs=N with N large enough"
        )

    def keep_checkpoints(self, t: Training, steps_per_epoch: int) -> set[int] | None:
        return None  # the trainer's checkpoint.keep_last decides

    def result(self, t: Training) -> Path:
        return self.out / "results" / f"{t.name}.json"

    def finished(self, progress: RunProgress) -> None:
        """``<out>/results/<name>.json``: the run, its commands, its seconds over every attempt and its evaluation's
        metrics (the table, written once every run is done, is made from the same reports)."""
        t, rec = progress.run, progress.record
        ((ev, report, _),) = progress.evaluated.values()
        result = {
            "run": t.name,
            "method": t.method,
            "seed": t.seed,
            "config": str(t.config),
            "overrides": list(t.overrides),
            "steps": self.steps,
            "command": shlex.join(progress.train_cmd),
            "eval_command": shlex.join(ev.cmd),
            "train_s": rec.get("train_s"),
            "eval_s": rec.get("eval_s"),
            "metrics": report.get("metrics", {}),
            "skipped": report.get("skipped", {}),
        }
        atomic.write_json(self.result(t), result, indent=1)
