"""Retrain the first epochs of a committed run and say whether its training statistics come back bit for bit:
the check of what a run's numbers depended on (the code it trained on, the CPU's thread count).

    python -m benchmarks.replication.retrace benchmarks/results/replication/cpu/<run>.json --threads 2 \\
        [--epochs 1] [--repo /path/to/a/checkout] --out benchmarks/results/replication/retrace/<name>.json

It reruns the result's own training command (its config and overrides) from ``--repo`` (default: this checkout;
a worktree at the result's ``git_commit`` retrains the code the run trained on) with OMP_NUM_THREADS=``--threads``,
in a scratch directory, and stops it once its epoch ``--epochs`` is recorded: the command is not shortened, so a
learning-rate schedule spans the run's own epochs. Then it compares each epoch's means (the trainer's
``epochs.jsonl``, read as the study reads them) with the result's ``train_per_epoch``, statistic by statistic and
exactly (the learning rate, the loss and its terms, the method's other statistics); the timings are the
machine's, not the run's, and are left out. Exit 0 whatever it finds: the record and the printed line say
which statistics are equal.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from hypersolid_scale.safety import atomic
from hypersolid_scale.tracking.metadata import git_commit, git_dirty
from hypersolid_scale.training.epoch_records import EPOCHS_FILE, read_epochs

ROOT = Path(__file__).resolve().parents[2]
# Not compared: an epoch record's place (equal by construction: the retraining stops at the recorded step) and its
# timings (training/step_bookkeeping.py's summary: the machine's speed, never equal twice).
NOT_COMPARED = ("epoch", "step", "steps", "images_per_s", "data_wait_share", "boundary_stall_s", "steady_wait_share")


def retrace_command(command: str, run_dir: Path) -> list[str]:
    """The result's training command, run by this interpreter into ``run_dir``; a clear error for a command this
    check cannot rerun (a multi-process launch, a random init)."""
    argv = shlex.split(command)
    if "launch/train.py" not in argv[1:2]:
        raise SystemExit(
            f"retrace reruns single-process trainings ('<python> launch/train.py ...'); this result's command is "
            f"{command!r}: retrace a run of the cpu group instead"
        )
    return [sys.executable, *(f"run_dir={run_dir}" if a.startswith("run_dir=") else a for a in argv[1:])]


def compare_epochs(
    recorded: list[dict[str, Any]], retraced: dict[int, dict[str, float]], epochs: int
) -> list[dict[str, Any]]:
    """Per epoch 1..``epochs``: the statistics equal bit for bit, and those that differ (recorded, retraced)."""
    out = []
    for rec in recorded[:epochs]:
        again = retraced.get(int(rec["epoch"]), {})
        keys = sorted(k for k in rec if k not in NOT_COMPARED)
        equal = [k for k in keys if k in again and again[k] == rec[k]]
        differ = {k: [rec[k], again.get(k)] for k in keys if k not in equal}
        out.append({"epoch": rec["epoch"], "equal": equal, "differ": differ})
    return out


def _past(epochs_so_far: dict[int, dict[str, float]], epochs: int, stop_step: int) -> bool:
    """Whether a retraining has recorded its epoch ``epochs`` at ``stop_step`` or has gone beyond that epoch."""
    return epochs_so_far.get(epochs, {}).get("step") == stop_step or max(epochs_so_far, default=0) > epochs


def retrace(result: dict[str, Any], repo: Path, threads: int, epochs: int, work: Path) -> dict[str, Any]:
    """Retrain ``result``'s first ``epochs`` epochs from ``repo`` at ``threads`` threads in ``work``; the record."""
    recorded = result.get("train_per_epoch") or []
    if len(recorded) < epochs:
        raise SystemExit(f"{result['run']} records {len(recorded)} epoch(s); ask for at most that many (--epochs)")
    stop_step = int(recorded[epochs - 1]["step"])
    run_dir = work / "run"
    cmd = retrace_command(result["command"], run_dir)
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": str(threads)}
    with open(work / "train.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=repo, env=env, stdout=log, stderr=subprocess.STDOUT)
        # Stopped once its epoch ``epochs`` is recorded (SIGTERM: it checkpoints and exits), not shortened by
        # max_steps, which would change a schedule's length; or once it is past that epoch at another step (a
        # checkout whose epochs are not the run's: the error below).
        while proc.poll() is None and not _past(read_epochs(run_dir / EPOCHS_FILE), epochs, stop_step):
            time.sleep(0.5)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.wait()
    retraced = read_epochs(run_dir / EPOCHS_FILE)
    reached = retraced.get(epochs, {}).get("step")
    if reached != stop_step:
        tail = (work / "train.log").read_text()[-3000:]
        raise SystemExit(
            f"the retraining's epoch {epochs} ended at step {reached}, the run's at {stop_step} (exit "
            f"{proc.returncode}): a training that failed, or a checkout whose data or batch are not the run's:\n{tail}"
        )
    per_epoch = compare_epochs(recorded, retraced, epochs)
    return {
        "run": result["run"],
        "result_git_commit": result.get("git_commit"),
        "result_threads": result.get("threads"),  # absent (None) from results made before threads were recorded
        "git_commit": git_commit(repo),  # None outside git
        "dirty": git_dirty(repo),
        "torch": torch.__version__,
        "threads": str(threads),
        "epochs": epochs,
        "command": shlex.join(cmd[1:]),
        "identical": all(not e["differ"] for e in per_epoch),
        "per_epoch": per_epoch,
    }


def summary(rec: dict[str, Any]) -> str:
    """One line: the run, where and how it was retraced, and per epoch how many statistics came back."""
    epochs = "; ".join(
        f"epoch {e['epoch']} equal on {len(e['equal'])} of {len(e['equal']) + len(e['differ'])} statistics"
        for e in rec["per_epoch"]
    )
    where = rec["git_commit"][:7] if rec["git_commit"] else "a tree outside git"
    return f"{rec['run']} retrained at {rec['threads']} thread(s) on {where}: {epochs}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("result", help="a run's result JSON (benchmarks/results/replication/<group>/<run>.json)")
    parser.add_argument("--threads", type=int, required=True, help="OMP_NUM_THREADS for the training")
    parser.add_argument("--epochs", type=int, default=1, help="how many of its first epochs to retrain")
    parser.add_argument("--repo", default=str(ROOT), help="the checkout to train (default: this one)")
    parser.add_argument("--out", required=True, help="write the record here")
    args = parser.parse_args(argv)
    if args.threads < 1 or args.epochs < 1:
        raise SystemExit("--threads and --epochs take an int >= 1")
    result = json.loads(Path(args.result).read_text())
    with tempfile.TemporaryDirectory() as tmp:
        rec = retrace(result, Path(args.repo).resolve(), args.threads, args.epochs, Path(tmp))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(out, json.dumps(rec, indent=1) + "\n")
    print(summary(rec) + (" (bit for bit)" if rec["identical"] else ""), flush=True)


if __name__ == "__main__":
    main()
