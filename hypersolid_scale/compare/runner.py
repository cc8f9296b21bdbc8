"""Run one training and one evaluation of a comparison as child processes, and remember what is done.

Each training is ``torchrun launch/train.py`` (``python launch/train.py`` on one process) and each evaluation
``launch/eval.py``: the very commands a user runs, so the comparison exercises the trainer, its checkpoints and
its tracking, not a copy of them. Their output goes to ``<out>/logs/<name>.{train,eval}.log``. A child ends with
the comparison: stopped by SIGTERM or Ctrl-C, the comparison passes SIGTERM on and waits while the trainer
checkpoints and exits; killed outright, it leaves the kernel to send the child SIGTERM. A comparison started
again on the same output directory resumes: a finished training or evaluation is kept, an interrupted training
resumes from its own newest checkpoint (the trainer's own resume), and the wall-clock already spent is kept in
``state.json``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypersolid_scale.compare.plan import Training, training_overrides
from hypersolid_scale.safety import atomic
from hypersolid_scale.safety.lifeline import EXIT_ORPHANED, die_with_parent

STATE = "state.json"
STOP_GRACE_S = 300  # a stopped comparison waits this long for its child's checkpoint, then kills it
# The quick smoke comparison's evaluation of every checkpoint: kNN at K=20 (the paper uses K=5 on small data sets:
# --protocol paper reports both), the linear probe, K-Means / DBSCAN eps sweep / HDBSCAN, and the geometry of the
# embedding, on backbone features.
EVAL_SUITES = "knn,linear,cluster,geometry"


@dataclass
class Paths:
    out: Path

    def run_dir(self, t: Training) -> Path:
        return self.out / "runs" / t.name

    def checkpoint(self, t: Training, steps: int) -> Path:
        from hypersolid_scale.checkpoint import checkpoint_path  # torch only when a checkpoint is looked for

        return checkpoint_path(self.run_dir(t), steps)

    def eval_dir(self, t: Training) -> Path:
        return self.out / "eval" / t.name

    def report(self, t: Training) -> Path:
        return self.eval_dir(t) / "report.json"

    def log(self, t: Training, stage: str) -> Path:
        return self.out / "logs" / f"{t.name}.{stage}.log"


class State:
    """``<out>/state.json``: the parent MLflow run and, per training, seconds spent and the outcome of each
    stage. Rewritten atomically after every change, so a kill never leaves half a file."""

    def __init__(self, out: Path):
        self.path = out / STATE
        self.data: dict[str, Any] = json.loads(self.path.read_text()) if self.path.exists() else {}
        self.data.setdefault("runs", {})

    def run(self, name: str) -> dict[str, Any]:
        return self.data["runs"].setdefault(name, {})

    def save(self) -> None:
        atomic.write_json(self.path, self.data, indent=1, sort_keys=True, newline=False)


def _end_with_us(parent: int) -> Callable[[], None]:
    def preexec() -> None:  # in the child, before exec
        if not die_with_parent(parent=parent, always=True):
            os._exit(EXIT_ORPHANED)

    return preexec


def _run(cmd: list[str], log: Path, env: dict[str, str], cwd: Path) -> tuple[int, float]:
    """Run ``cmd`` with its output appended to ``log``; (exit code, seconds)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with open(log, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        proc = subprocess.Popen(
            cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd, preexec_fn=_end_with_us(os.getpid())
        )
        try:
            rc = proc.wait()
        except BaseException:  # SIGTERM or Ctrl-C of the comparison: the child stops as preempted, then we do
            proc.terminate()  # a training finishes its step, checkpoints and exits 75 (torchrun passes it on)
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
    return rc, time.monotonic() - t0


def last_error(log: Path) -> str:
    """The line of ``log`` that says why a child failed (its ``error:`` line, else its last line)."""
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()] if log.exists() else []
    errors = [ln for ln in lines if re.match(r"(\[rank \d+\] )?error:", ln)]  # the one-line errors of run_cli
    return (errors or lines or ["(no output)"])[-1][:300]


@dataclass
class Runner:
    """Trains and evaluates the comparison's runs. ``repo`` holds ``launch/``; ``tracking`` are the overrides
    that put each training into the comparison's MLflow experiment, under its parent run."""

    paths: Paths
    state: State
    repo: Path
    steps: int
    nproc: int
    tracking: list[str]
    eval_overrides: list[str]
    mlflow: bool
    device: str = "auto"
    protocol: str | None = None  # launch/eval.py --protocol NAME instead of --suite EVAL_SUITES

    def _env(self, processes: int) -> dict[str, str]:
        # The cores shared among the processes, as the quickstart does (unless the user set it).
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // processes)))
        return env

    def train(self, t: Training) -> str | None:
        """Train ``t`` to the budget unless done; None when its final checkpoint exists, else the error."""
        record = self.state.run(t.name)
        if self.paths.checkpoint(t, self.steps).exists():
            return None
        # One process: the trainer itself, without a torchrun agent around it (its start, ~3 s, buys nothing).
        launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={self.nproc}"]
        cmd = [
            sys.executable,
            *(launcher if self.nproc > 1 else []),
            str(self.repo / "launch" / "train.py"),
            "--config",
            str(t.config),
            *training_overrides(t, steps=self.steps, run_dir=self.paths.run_dir(t)),
            *self.tracking,
            f"tracking.run_name={t.name}",
        ]
        rc, seconds = _run(cmd, self.paths.log(t, "train"), self._env(self.nproc), self.repo)
        record["train_s"] = record.get("train_s", 0.0) + seconds  # a resumed training adds to its first part
        done = self.paths.checkpoint(t, self.steps).exists()
        record["train"] = "done" if rc == 0 and done else f"failed (exit {rc})"
        self.state.save()
        if rc != 0:
            return f"training failed (exit {rc}): {last_error(self.paths.log(t, 'train'))}"
        if not done:
            return (
                f"training ended before step {self.steps} (no {self.paths.checkpoint(t, self.steps).name}): "
                "its epochs end first; pass epochs=N with N large enough"
            )
        return None

    def evaluate(self, t: Training) -> str | None:
        """Evaluate ``t``'s final checkpoint unless its report exists; None on success, else the error."""
        record = self.state.run(t.name)
        ckpt = self.paths.checkpoint(t, self.steps)
        report = self.paths.report(t)
        # A report of the other evaluation (the quick suites, another protocol) is not this one's.
        same = record.get("evaluated") == str(ckpt) and record.get("protocol") == self.protocol
        if report.exists() and record.get("eval") == "done" and same:
            return None
        cmd = [
            sys.executable,
            str(self.repo / "launch" / "eval.py"),
            "--checkpoint",
            str(ckpt),
            "--output-dir",
            str(self.paths.eval_dir(t)),
            *(["--protocol", self.protocol] if self.protocol else ["--suite", EVAL_SUITES]),
            "--device",
            self.device,
            *([] if self.mlflow else ["--no-mlflow"]),
            *self.eval_overrides,
        ]
        rc, seconds = _run(cmd, self.paths.log(t, "eval"), self._env(1), self.repo)
        record["eval_s"] = seconds
        record["eval"] = "done" if rc == 0 else f"failed (exit {rc})"
        record["evaluated"] = str(ckpt)
        record["protocol"] = self.protocol
        self.state.save()
        if rc != 0:
            return f"evaluation failed (exit {rc}): {last_error(self.paths.log(t, 'eval'))}"
        return None
