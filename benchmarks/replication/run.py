"""Train and evaluate the replication study's runs (plan.py), N subprocesses at a time, resumably.

    python -m benchmarks.replication.run --group cpu|gpu [--device cpu|cuda] [--parallel N] [--budget-s S]
        [--scale F] [--quick] [--out DIR] [--scratch DIR]

Per run: ``launch/train.py`` into ``<scratch>/<group>/<run>/run``, ``launch/eval.py`` on the checkpoints of
interest (every epoch of a curve, the final one otherwise), then ``<out>/<group>/<run>.json``. Trainings and
evaluations share the N slots; evaluations go first, so finished trainings turn into results first.

The study engine (``hypersolid_scale.study``) runs them; this file says what the study's runs are to it: their
commands, their evaluations (commands.py), their result (result.py). Its state file is
``<scratch>/<group>/state.json``. Resuming: a run whose result JSON exists is skipped; a finished training is not
run again; an evaluation recorded as done whose ``report.json`` exists is reused; a training killed mid-way
resumes from its newest checkpoint (the trainer's ``checkpoint.resume=auto``; the result records
``resumed_from_step``).

Budget (``--budget-s``): a training starts only if its estimated time (seconds per epoch measured on the runs
finished so far, a prior before that) ends before the budget; what does not fit, or is trained but not
evaluated, is listed in ``<out>/<group>/_skipped.json`` and runs on the next invocation.

Measured on one H200 (first GPU attempt, 12 at once): ~20 s per epoch and process, ~80 s per full protocol
evaluation, ~22 s per kNN-only one; on this 2-core CPU, one at a time: 2.5-5 min per epoch, 45-140 s per
evaluation (measured when the protocol's projector half ran for Hypersolid only; it runs for every method with
a projection head now).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.common import ROOT
from benchmarks.replication.commands import CURVE_EVAL_ARGS, eval_arguments, eval_tasks
from benchmarks.replication.plan import plan, quick_run
from benchmarks.replication.result import best_knn, run_result
from benchmarks.replication.runfiles import read_json, write_json
from benchmarks.replication.runspec import Run
from hypersolid_scale.study import Engine, Evaluation, StudyState
from hypersolid_scale.study.engine import Prior
from hypersolid_scale.study.protocol import RunProgress

PRIORS = {"cuda": Prior(20.0, 6.0, 30.0), "cpu": Prior(15.0, 600.0, 180.0), "quick": Prior(15.0, 5.0, 20.0)}
OUT = str(common.run_dir("replication"))  # cpu.sh and gpu.sh name benchmarks/results/replication, the committed one
# The run folders (checkpoints): ignored by git, and kept across a reboot (/tmp is cleared at boot on many systems,
# and a 100-epoch run resumes from its checkpoint over several sittings).
SCRATCH = str(ROOT / "runs" / "replication_scratch")
STOP_GRACE_S = 8.0  # gpu.sh's timeout kills everything 10 s after its SIGTERM


class Replication:
    """The replication study to the engine (hypersolid_scale.study.engine.Study)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.py = sys.executable
        self.out = Path(args.out) / args.group
        self.scratch = Path(args.scratch) / args.group
        self.say: Callable[[str], None] = print  # the engine's, once it exists
        self._full_args: list[str] | None = None
        self._facts: tuple[str, str, str] | None = None

    # Both cost a Python start with torch: asked for only when a run needs them, so that a rerun over
    # finished runs returns at once.
    @property
    def full_args(self) -> list[str]:
        if self._full_args is None:
            self._full_args = CURVE_EVAL_ARGS if self.args.quick else eval_arguments(self.py)
        return self._full_args

    @property
    def facts(self) -> tuple[str, str, str]:
        if self._facts is None:
            # The GPU machine's copy may have no .git, or a stale one: its caller sets $HYPERSOLID_GIT_COMMIT.
            self._facts = (common.card(self.args.device), common.torch_version(), common.commit())
        return self._facts

    def home(self, run: Run) -> Path:
        return self.scratch / run.name

    def run_dir(self, run: Run) -> Path:
        return self.home(run) / "run"

    def train_log(self, run: Run) -> Path:
        return self.home(run) / "train.log"

    def eval_log(self, run: Run, ev: Evaluation) -> Path:
        return ev.out / "eval.log"

    def processes(self, run: Run) -> int:
        return 1

    def train_command(self, run: Run) -> list[str]:
        where = ["--config", run.config, f"run_dir={self.run_dir(run)}"]
        # A random-init run trains one step to write a checkpoint, then swaps in the initial weights.
        script = "benchmarks/replication/random_init.py" if run.random_init else "launch/train.py"
        return [self.py, script, *where, *run.train_overrides(self.args.device, self.args.quick)]

    def evaluations(self, run: Run, final_step: int, upto: int | None) -> tuple[list[Evaluation], list[str]]:
        return eval_tasks(
            run, self.home(run), final_step, upto, self.full_args, self.py, self.args.device, self.args.quick
        )

    def is_trained(self, run: Run, record: dict[str, Any]) -> bool:
        return record.get("train") == "done"

    def is_finished(self, run: Run) -> bool:
        result = read_json(self.out / f"{run.name}.json")
        return result is not None and result.get("complete", True)  # a staged run's result so far is not

    def trained_error(self, run: Run, final_step: int) -> str | None:
        return None

    def keep_checkpoints(self, run: Run, steps_per_epoch: int) -> set[int] | None:
        """A run evaluated at chosen epochs (Run.eval_epochs) keeps those epochs' ends, its diagnosed epochs' and its
        pauses' (and the engine keeps the newest two); the trainer keeps them all (checkpoint.keep_last=0)."""
        if not run.eval_epochs or run.curve or run.eval_every_steps:
            return None
        return {e * steps_per_epoch for e in (*run.eval_epochs, *run.diagnose_epochs, *run.pause_epochs, run.epochs)}

    def finished(self, progress: RunProgress) -> None:
        result = run_result(progress, self.run_dir(progress.run), self.facts)
        write_json(self.out / f"{progress.run.name}.json", result)
        grid = result.get("hdbscan_grid")
        diagnosis = f", the HDBSCAN diagnosis of its {' and '.join(grid)} features" if grid else ""
        self.say(
            f"done {progress.run.name}: train {progress.train_s:.0f}s, eval {progress.eval_s:.0f}s, "
            f"{len(result['per_epoch'])} evaluation(s), {best_knn(result)}{diagnosis}"
        )


def engine(args: argparse.Namespace) -> Engine:
    """The engine that runs the study's ``args`` (state file ``<scratch>/<group>/state.json``)."""
    threads = max(1, (os.cpu_count() or 1) // args.parallel)  # N processes must not each take every core
    env = {
        **os.environ,
        # The caller's setting wins (a shared machine: cpu.sh's OMP_NUM_THREADS=1 under nice).
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS") or str(threads),
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
        "PYTHONUNBUFFERED": "1",
        "MPLBACKEND": "Agg",
    }
    study = Replication(args)
    eng = Engine(
        study,
        StudyState(Path(args.scratch) / args.group / "state.json"),
        slots=args.parallel,
        budget_s=args.budget_s,
        prior=PRIORS["quick" if args.quick else args.device],
        grace_s=STOP_GRACE_S,
        env=env,
        cwd=ROOT,
        progress=False,  # one line per run in a log (cpu.sh, gpu.sh), not a bar
        say=lambda line: print(line, flush=True),
    )
    study.say = eng.say
    return eng


def write_skipped(args: argparse.Namespace, eng: Engine, runs: list[Run]) -> None:
    """``<out>/<group>/_skipped.json``: what did not run or did not finish, and why (run, part, reason)."""
    part = {r.name: r.part for r in runs}
    skipped = [{"run": s["run"], "part": part.get(s["run"], ""), "reason": s["reason"]} for s in eng.skipped]
    elapsed = round(eng.elapsed(), 1)
    out = Path(args.out) / args.group
    write_json(out / "_skipped.json", {"elapsed_s": elapsed, "budget_s": args.budget_s, "skipped": skipped})
    eng.say(f"finished: {len(skipped)} skipped item(s) in {out / '_skipped.json'}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--group", choices=("cpu", "gpu"), required=True)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--parallel", type=int, default=1, help="subprocesses at once (trainings and evaluations)")
    p.add_argument("--budget-s", type=float, default=0.0, help="stop starting work past this (0: no budget)")
    p.add_argument("--scale", type=float, default=None, help="gpu group: epochs x scale (default: gpu_plan.GPU_SCALE)")
    p.add_argument("--quick", action="store_true", help="2 tiny one-epoch runs, kNN only (tests, dry runs)")
    p.add_argument("--runs", default="", help="only these runs of the group, comma-separated names")
    p.add_argument("--out", default=None, help=f"results (default {OUT}; with --quick <scratch>/results)")
    p.add_argument("--scratch", default=None, help=f"run directories (default {SCRATCH}; with --quick <it>/quick)")
    args = p.parse_args(argv)
    if args.parallel < 1:
        p.error("--parallel must be >= 1")
    # Quick runs share the real runs' names: apart, they can neither be resumed by nor pass for real runs.
    args.scratch = args.scratch or (str(Path(SCRATCH) / "quick") if args.quick else SCRATCH)
    args.out = args.out or (str(Path(args.scratch) / "results") if args.quick else OUT)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM (timeout, kill) unwinds through the engine's finally: children checkpoint, _skipped.json is written.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    runs = plan(args.group, args.scale, args.quick)
    if args.runs:  # by name, from the whole group (quick: made tiny as the quick plan's own)
        wanted, every = args.runs.split(","), {r.name: r for r in plan(args.group, args.scale)}
        if unknown := [n for n in wanted if n not in every]:
            raise SystemExit(f"--runs: no run {', '.join(unknown)} in the {args.group} group (see plan.py --group)")
        runs = [quick_run(every[n]) if args.quick else every[n] for n in wanted]
    eng = engine(args)
    eng.say(
        f"{args.group}: {len(runs)} runs, {args.parallel} at a time on {args.device}, "
        f"budget {f'{args.budget_s:.0f} s' if args.budget_s else 'none'}"
    )
    try:
        return eng.run(runs)
    finally:
        write_skipped(args, eng, runs)


if __name__ == "__main__":
    sys.exit(main())
