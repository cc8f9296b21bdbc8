"""What the replication study evaluates (run.py): the evaluation commands of a checkpoint and the evaluations of
a trained run, as the study engine's Evaluations."""

from __future__ import annotations

import subprocess
from pathlib import Path

from benchmarks.common import ROOT
from benchmarks.replication.runspec import QUICK_EVAL, Run
from hypersolid_scale.study.files import checkpoints
from hypersolid_scale.study.plan import Evaluation

# The paper's protocol, once launch/eval.py has it; until then the suites that exist (eval_arguments).
EVAL_ARGS = ["--protocol", "paper"]
FALLBACK_EVAL_ARGS = ["--suite", "knn,linear,cluster,geometry"]
# Curves: kNN only (k = 5, 20; the protocol's 10,000-image bank) at intermediate epochs, the full protocol at the
# quarter point (5 of 20) and the end: a full protocol per epoch would cost the clustering and probe 20 times.
CURVE_EVAL_ARGS = ["--suite", "knn", "eval.knn_k=[5,20]", "eval.max_train_samples=10000"]
# The HDBSCAN diagnosis (Run.diagnose): the hdbscan_grid suite, centred with the protocol's 10,000-image bank.
DIAG_EVAL_ARGS = ["--suite", "hdbscan_grid", "eval.max_train_samples=10000"]
DIAG_FEATURES = ("backbone", "projector")


def eval_arguments(py: str) -> list[str]:
    """EVAL_ARGS when launch/eval.py knows ``--protocol``, else FALLBACK_EVAL_ARGS."""
    out = subprocess.run([py, "launch/eval.py", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    return EVAL_ARGS if "--protocol" in out.stdout else FALLBACK_EVAL_ARGS


def eval_command(py: str, checkpoint: Path, out: Path, device: str, args: list[str], quick: bool) -> list[str]:
    """The evaluation command of one checkpoint: ``args`` are EVAL_ARGS (the paper's protocol), a fallback or
    CURVE_EVAL_ARGS; ``quick`` caps the evaluation sets (QUICK_EVAL)."""
    where = ["--checkpoint", str(checkpoint), "--output-dir", str(out), "--device", device]
    return [py, "launch/eval.py", *where, "--no-mlflow", *args, *(QUICK_EVAL if quick else ())]


def eval_tasks(
    run: Run, home: Path, final: int, upto: int | None, full_args: list[str], py: str, device: str, quick: bool
) -> tuple[list[Evaluation], list[str]]:
    """The evaluations of a training that reached step ``final`` (in ``home``), and why any is missing: the
    steps at epoch ends (steps per epoch = final step / epochs: the plan trains whole epochs), every epoch for a
    curve, else the last; a staged training paused at epoch ``upto``: the eval_epochs up to it. The full
    protocol (``full_args``) at the end and the quarter point of a curve, CURVE_EVAL_ARGS between; the HDBSCAN
    diagnosis (DIAG_EVAL_ARGS) of the final checkpoint of a run that asks for it, and of the ends of its
    ``diagnose_epochs`` (those reached, when paused)."""
    per_epoch = final // (upto or run.epochs)
    ckpts = checkpoints(home / "run")
    epochs = range(1, run.epochs + 1) if run.curve else run.eval_epochs or [run.epochs]
    if upto is not None:
        epochs = [e for e in epochs if e <= upto]
    full = {run.epochs, max(1, round(run.epochs / 4))}
    points: list[tuple[float, int]] = [(e, e * per_epoch) for e in epochs]
    if run.random_init:  # the initial weights only (random_init.py left no other checkpoint)
        points = [(0, 0)]
    if run.eval_every_steps:  # fractional epochs: the step's position in the run
        every = sorted({*range(run.eval_every_steps, final + 1, run.eval_every_steps), final})
        points = [(round(s / per_epoch, 3), s) for s in every]
    if run.diagnose_only:
        points = []
    tasks: list[Evaluation] = []
    missing: list[str] = []
    for epoch, step in points:
        if step not in ckpts:
            missing.append(f"no checkpoint for epoch {epoch} (step {step})")
            continue
        args = full_args if (epoch in full or not run.curve) else CURVE_EVAL_ARGS
        protocol = "paper" if args == EVAL_ARGS else args[1]
        out = home / "eval" / f"step_{step:08d}_{protocol.replace(',', '+')}"
        cmd = eval_command(py, ckpts[step], out, device, args, quick)
        tasks.append(Evaluation(out.name, tuple(cmd), out, step, epoch, protocol))
    diagnosed = [(e, e * per_epoch) for e in run.diagnose_epochs if upto is None or e <= upto]
    if (run.diagnose or run.diagnose_only) and upto is None:
        diagnosed.append((0, 0 if run.random_init else final))
    for epoch, step in diagnosed:
        if step not in ckpts:
            missing.append(f"no checkpoint for the diagnosis (step {step})")
        for kind in DIAG_FEATURES if step in ckpts else ():
            out = home / "eval" / f"step_{step:08d}_hdbscan_grid_{kind}"
            cmd = eval_command(py, ckpts[step], out, device, [*DIAG_EVAL_ARGS, "--features", kind], quick)
            tasks.append(Evaluation(out.name, tuple(cmd), out, step, epoch, f"hdbscan_grid.{kind}"))
    return tasks, missing
