"""Train and evaluate the replication study's runs (plan.py), N subprocesses at a time, resumably.

    python -m benchmarks.replication.run --group cpu|gpu [--device cpu|cuda] [--parallel N] [--budget-s S]
        [--scale F] [--quick] [--out DIR] [--scratch DIR]

Per run: ``launch/train.py`` into ``<scratch>/<group>/<run>/run``, ``launch/eval.py`` on the checkpoints of
interest (every epoch of a curve, the final one otherwise), then ``<out>/<group>/<run>.json``. Trainings and
evaluations share the N slots; evaluations go first, so finished trainings turn into results first.

Resuming: a run whose result JSON exists is skipped; a finished training (``train_done.json``) is not run
again; an evaluation whose ``report.json`` exists is reused; a training killed mid-way resumes from its newest
checkpoint (the trainer's ``checkpoint.resume=auto``; the result records ``resumed_from_step``).

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
import re
import signal
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.common import ROOT
from benchmarks.replication.commands import CURVE_EVAL_ARGS, Task, eval_arguments, eval_tasks
from benchmarks.replication.plan import plan, quick_run
from benchmarks.replication.result import State, best_knn, run_result
from benchmarks.replication.runfiles import (
    attempts_total,
    checkpoints,
    prune_checkpoints,
    read_json,
    record_attempt,
    start_attempt,
    write_json,
)
from benchmarks.replication.runspec import Run

PRIORS = {"cuda": (20.0, 6.0, 30.0), "cpu": (15.0, 600.0, 180.0), "quick": (15.0, 5.0, 20.0)}  # before measures:
# (start-up s, s per epoch, s per evaluation) for the budget
OUT = str(common.run_dir("replication"))  # cpu.sh and gpu.sh name benchmarks/results/replication, the committed one
SCRATCH = "/tmp/hs_replication"  # checkpoints stay out of the repository
RESUMED = re.compile(r"resumed from \S+ at step (\d+)")
STEPS_PER_EPOCH = re.compile(r"(\d+) steps/epoch")  # the trainer's first line
STAGE = "stage.json"  # a staged run's progress: {"trained_to_epoch": E} (Run.pause_epochs)
PRUNE_EVERY_S = 30.0  # how often unneeded checkpoints of a running training are deleted (Driver.prune)
ATTEMPT_TICK_S = 30.0  # how often a running training's seconds are recorded (runfiles.ATTEMPTS)


class Driver:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.py = sys.executable
        self.out = Path(args.out) / args.group
        self.scratch = Path(args.scratch) / args.group
        self.t0 = time.monotonic()
        self.deadline = self.t0 + args.budget_s if args.budget_s else float("inf")
        prior = PRIORS["quick" if args.quick else args.device]
        self.startup_s, self.epoch_s, self.eval_s = prior
        # The first measurement replaces the prior, later ones can only raise it (a pessimistic budget).
        self.measured = {"train": False, "eval": False}
        self.skipped: list[dict[str, Any]] = []
        self.failed = 0
        self.active: dict[subprocess.Popen, Task] = {}
        self.evals: deque[Task] = deque()
        self.trains: deque[Task] = deque()
        self.states: dict[str, State] = {}
        threads = max(1, (os.cpu_count() or 1) // args.parallel)  # N processes must not each take every core
        self.env = {
            **os.environ,
            # The caller's setting wins (a shared machine: cpu.sh's OMP_NUM_THREADS=1 under nice).
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS") or str(threads),
            "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
            "PYTHONUNBUFFERED": "1",
            "MPLBACKEND": "Agg",
        }
        self._full_args: list[str] | None = None
        self._last_tick = self._last_prune = 0.0
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

    # ---- helpers -----------------------------------------------------------------------------------------
    def say(self, msg: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.0f}s] {msg}", flush=True)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def estimate(self, run: Run) -> float:
        return self.startup_s + run.epochs * self.epoch_s + self.eval_s

    def launch(self, task: Task) -> None:
        task.log.parent.mkdir(parents=True, exist_ok=True)
        task.t0 = time.monotonic()
        if task.kind == "train":
            start_attempt(task.log.parent)
        with task.log.open("w") as log:
            proc = subprocess.Popen(task.cmd, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self.active[proc] = task

    def tick_attempts(self) -> None:
        """Record every running training's seconds so far (every ATTEMPT_TICK_S): a driver killed with its
        training (SIGKILL, a session's end) loses at most that much of the run's training time."""
        now = time.monotonic()
        if now - self._last_tick < ATTEMPT_TICK_S:
            return
        self._last_tick = now
        for task in self.active.values():
            if task.kind == "train":
                record_attempt(task.log.parent, now - task.t0)

    def skip(self, run: Run, reason: str) -> None:
        self.skipped.append({"run": run.name, "part": run.part, "reason": reason})

    # ---- per run -----------------------------------------------------------------------------------------
    def train_task(self, run: Run) -> Task:
        home = self.scratch / run.name
        where = ["--config", run.config, f"run_dir={home / 'run'}"]
        # A random-init run trains one step to write a checkpoint, then swaps in the initial weights.
        script = "benchmarks/replication/random_init.py" if run.random_init else "launch/train.py"
        cmd = [self.py, script, *where, *run.train_overrides(self.args.device, self.args.quick)]
        self.states[run.name] = State(run, home, cmd)
        return Task(run, "train", cmd, home / "train.log", pause_epoch=self._next_pause(run, home))

    @staticmethod
    def _next_pause(run: Run, home: Path) -> int:
        trained_to = int((read_json(home / STAGE) or {}).get("trained_to_epoch", 0))
        return next((e for e in run.pause_epochs if trained_to < e < run.epochs), 0)

    @staticmethod
    def steps_per_epoch(task: Task) -> int:
        """A training's steps per epoch, from the trainer's first line (0 until it is written)."""
        if not task.per_epoch and task.log.exists():
            found = STEPS_PER_EPOCH.search(task.log.read_text(errors="replace"))
            task.per_epoch = int(found.group(1)) if found else 0
        return task.per_epoch

    def watch_pauses(self) -> None:
        """SIGTERM a staged training once its pause epoch's checkpoint exists (it checkpoints and exits 75)."""
        for proc, task in self.active.items():
            if task.kind != "train" or not task.pause_epoch or task.pausing:
                continue
            task.pause_step = self.steps_per_epoch(task) * task.pause_epoch
            if task.pause_step and task.pause_step in checkpoints(task.log.parent / "run"):
                proc.terminate()
                task.pausing = True

    def prune(self) -> None:
        """Every PRUNE_EVERY_S, delete a running training's checkpoints that nothing will read: those of a run
        evaluated at chosen epochs (Run.eval_epochs) that are neither those epochs' ends, nor a pause's, nor the
        newest two (runfiles.prune_checkpoints). The trainer keeps them all (checkpoint.keep_last=0)."""
        now = time.monotonic()
        if now - self._last_prune < PRUNE_EVERY_S:
            return
        self._last_prune = now
        for task in self.active.values():
            run = task.run
            if task.kind != "train" or not run.eval_epochs or run.curve or run.eval_every_steps:
                continue
            if per_epoch := self.steps_per_epoch(task):
                keep = {e * per_epoch for e in (*run.eval_epochs, *run.pause_epochs, run.epochs)}
                prune_checkpoints(task.log.parent / "run", keep)

    def paused(self, task: Task, seconds: float) -> None:
        """A staged training stopped at its pause: record the stage, evaluate what it reached, queue the rest."""
        st = self.states[task.run.name]
        record_attempt(task.log.parent, seconds)  # this attempt's whole time (the ticks may not have come)
        write_json(task.log.parent / STAGE, {"trained_to_epoch": task.pause_epoch})
        self.say(f"paused {task.run.name} after epoch {task.pause_epoch} ({seconds:.0f}s); it resumes later")
        st.stage_epoch = task.pause_epoch
        self.queue_evals(st, final=task.pause_step, upto=task.pause_epoch)
        # The next stage, after every training queued now (the same state: its evaluations so far stay).
        nxt = self._next_pause(task.run, task.log.parent)
        self.trains.append(Task(task.run, "train", st.train_cmd, task.log, pause_epoch=nxt))

    def queue_evals(self, st: State, final: int | None = None, upto: int | None = None) -> None:
        """Queue the evaluations of a finished training (commands.eval_tasks), or of a staged one paused at epoch
        ``upto`` (its step ``final``)."""
        final = int(read_json(st.home / "train_done.json")["final_step"]) if final is None else final
        tasks, missing = eval_tasks(
            st.run, st.home, final, upto, self.full_args, self.py, self.args.device, self.args.quick
        )
        for why in missing:
            self.skip(st.run, why)
        # Every evaluation is counted before a cached one is taken: the run is finished once, with all of them.
        st.pending += len(tasks)
        for task in tasks:
            if read_json(task.log.parent / "report.json") is not None:
                self.eval_done(task, 0.0)
            else:
                self.evals.append(task)
        if st.pending == 0:
            self.finish(st)

    def eval_done(self, task: Task, seconds: float) -> None:
        st = self.states[task.run.name]
        report = read_json(task.log.parent / "report.json") or {}
        st.eval_s += seconds
        if task.protocol.startswith("hdbscan_grid."):  # the diagnosis: its rows, kept apart from the evaluations
            kind = task.protocol.split(".", 1)[1]
            st.diagnosis[kind] = {"step": task.step, "eval_s": round(seconds, 2), "rows": report.get("hdbscan_grid")}
            st.diagnosis[kind]["skipped"] = report.get("skipped", {})
        else:
            self._entry(st, task, report, seconds)
        st.pending -= 1
        if st.pending == 0 and not any(s["run"] == task.run.name for s in self.skipped):
            self.finish(st)

    def _entry(self, st: State, task: Task, report: dict[str, Any], seconds: float) -> None:
        st.eval_cmd = st.eval_cmd or task.cmd
        entry = {"epoch": task.epoch, "step": task.step, "protocol": task.protocol, "eval_s": round(seconds, 2)}
        entry["bank"] = (report.get("eval_config") or {}).get("max_train_samples")  # kNN's memory bank (None: all)
        # A staged run evaluated at a pause meets those evaluations again (cached) at its end: one entry each.
        st.entries = [e for e in st.entries if (e["step"], e["protocol"]) != (task.step, task.protocol)]
        st.entries.append({**entry, **report.get("metrics", {}), "skipped_metrics": report.get("skipped", [])})

    def finish(self, st: State) -> None:
        result = run_result(st, self.facts)
        write_json(self.out / f"{st.run.name}.json", result)
        self.say(
            f"done {st.run.name}: train {st.train_s:.0f}s, eval {st.eval_s:.0f}s, "
            f"{len(result['per_epoch'])} evaluation(s), {best_knn(result)}"
        )

    def reaped(self, proc: subprocess.Popen, task: Task) -> None:
        seconds, rc = time.monotonic() - task.t0, proc.returncode
        st = self.states[task.run.name]
        if task.kind == "eval":
            if read_json(task.log.parent / "report.json") is None:  # exit 3 (all skipped) still writes one
                self.failed += 1
                self.skip(task.run, f"evaluation of step {task.step} failed (rc {rc}, log {task.log})")
                self.say(f"FAILED eval {task.run.name} step {task.step} rc={rc}: see {task.log}")
                st.pending -= 1
                return
            self.eval_s = max(self.eval_s, seconds) if self.measured["eval"] else seconds
            self.measured["eval"] = True
            self.eval_done(task, seconds)
            return
        st.train_s = seconds
        if task.pausing and rc in (0, 75):
            self.paused(task, seconds)
            return
        st.stage_epoch = 0
        if rc != 0:
            self.failed += 1
            self.skip(task.run, f"training failed (rc {rc}, log {task.log})")
            self.say(f"FAILED train {task.run.name} rc={rc}: see {task.log}")
            return
        text = task.log.read_text(errors="replace")
        resumed = RESUMED.findall(text)
        start = int(resumed[-1]) if resumed else 0
        final = max(checkpoints(st.home / "run"), default=0)
        if not task.run.random_init:  # one step says nothing about an epoch's time
            per_epoch_s = max(0.0, seconds - self.startup_s) * final / max(1, (final - start)) / task.run.epochs
            self.epoch_s = max(self.epoch_s, per_epoch_s) if self.measured["train"] else per_epoch_s
            self.measured["train"] = True
        write_json(
            st.home / "train_done.json",
            {
                "final_step": final,
                "train_s": round(seconds, 2),
                "train_s_attempts": round(attempts_total(st.home, seconds), 2),
                "resumed_from_step": start if resumed else None,
            },
        )
        self.queue_evals(st)

    # ---- the loop ----------------------------------------------------------------------------------------
    def run(self, runs: list[Run]) -> int:
        trains = self.trains
        for run in runs:
            result = read_json(self.out / f"{run.name}.json")
            if result is not None and result.get("complete", True):  # a staged run's result so far is not
                self.say(f"skip {run.name}: result exists")
                continue
            task = self.train_task(run)
            if (task.log.parent / "train_done.json").exists():
                self.queue_evals(self.states[run.name])
            else:
                trains.append(task)
        try:
            while trains or self.evals or self.active:
                for proc, task in list(self.active.items()):
                    if proc.poll() is not None:
                        del self.active[proc]
                        self.reaped(proc, task)
                # Evaluations first (they turn finished trainings into results), then trainings; whatever
                # would end past the budget is skipped now, not queued, so the loop ends once the budget is reached.
                while len(self.active) < self.args.parallel and (self.evals or trains):
                    t = self.evals.popleft() if self.evals else trains.popleft()
                    need = self.eval_s if t.kind == "eval" else self.estimate(t.run)
                    if self.left() > need:
                        self.launch(t)
                    elif t.kind == "eval":
                        self.skip(t.run, f"budget: trained, step {t.step} not evaluated (rerun to evaluate)")
                    else:
                        self.skip(t.run, f"budget: needs ~{need:.0f}s, {self.left():.0f}s left")
                self.tick_attempts()
                self.watch_pauses()
                self.prune()
                time.sleep(0.2)
        finally:
            self.stop_children()
            self.write_skipped(list(trains))
        return 1 if self.failed else 0

    def stop_children(self) -> None:
        """SIGTERM: a training checkpoints and exits 75, so a rerun resumes where it stopped."""
        for proc in self.active:
            proc.terminate()
        end = time.monotonic() + 8  # gpu.sh's timeout kills everything 10 s after its SIGTERM
        for proc, task in self.active.items():
            try:
                proc.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
            self.skip(task.run, f"interrupted during {task.kind}")

    def write_skipped(self, trains: list[Task]) -> None:
        for t in trains:
            self.skip(t.run, "interrupted before training")
        self.evals.clear()
        elapsed = round(time.monotonic() - self.t0, 1)
        write_json(
            self.out / "_skipped.json", {"elapsed_s": elapsed, "budget_s": self.args.budget_s, "skipped": self.skipped}
        )
        self.say(f"finished: {len(self.skipped)} skipped item(s) in {self.out / '_skipped.json'}")


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
    # SIGTERM (timeout, kill) unwinds through run()'s finally: children checkpoint, _skipped.json is written.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    runs = plan(args.group, args.scale, args.quick)
    if args.runs:  # by name, from the whole group (quick: made tiny as the quick plan's own)
        wanted, every = args.runs.split(","), {r.name: r for r in plan(args.group, args.scale)}
        if unknown := [n for n in wanted if n not in every]:
            raise SystemExit(f"--runs: no run {', '.join(unknown)} in the {args.group} group (see plan.py --group)")
        runs = [quick_run(every[n]) if args.quick else every[n] for n in wanted]
    driver = Driver(args)
    driver.say(
        f"{args.group}: {len(runs)} runs, {args.parallel} at a time on {args.device}, "
        f"budget {f'{args.budget_s:.0f} s' if args.budget_s else 'none'}"
    )
    return driver.run(runs)


if __name__ == "__main__":
    sys.exit(main())
