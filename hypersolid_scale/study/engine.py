"""The study engine: every planned run trained, then its checkpoints evaluated, as child processes in N slots.

A training is the user's own command (``launch/train.py``, or torchrun around it) and an evaluation
``launch/eval.py``: a study exercises the trainer, its checkpoints and its evaluation, not a copy of them.

- **Slots.** Trainings and evaluations share ``slots`` child processes; evaluations go first, so finished
  trainings turn into results first. Each child gets ``OMP_NUM_THREADS`` = cores / (slots x its processes)
  unless the caller set it.
- **Budget** (``budget_s``): a training starts only if its estimate (start-up + epochs x seconds per epoch +
  one evaluation: a prior, then what the finished runs measured, never lowered) ends before the budget; what
  does not fit is reported as skipped, and runs on the next start.
- **Stages** (a run's ``pause_epochs``): the training is stopped (SIGTERM: it checkpoints and exits 75) once
  its checkpoint at the end of that epoch exists, the epochs reached are evaluated and the result so far written,
  and the run goes on after every run queued now has had its turn; started again, the engine queues the runs that
  have passed fewer pauses first.
- **Resuming.** Started again on the same state file, the engine skips what the study says is finished, does not
  train again what is trained, reuses every evaluation recorded as done whose report exists, and resumes an
  interrupted training from its newest checkpoint (the trainer's ``checkpoint.resume=auto``). A run's training
  seconds are summed over its attempts, and each attempt's ``OMP_NUM_THREADS`` is recorded (a CPU run resumed at
  another thread count is not bit-identical).
- **Stopping.** SIGTERM or Ctrl-C of the study (raised in its main thread) passes SIGTERM to the children and waits
  ``grace_s`` for them (a training finishes its step and checkpoints); a study killed outright leaves the kernel
  to send its children SIGTERM (``die_with_parent``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from hypersolid_scale.safety.lifeline import EXIT_ORPHANED, die_with_parent
from hypersolid_scale.study.files import checkpoints, last_error, prune_checkpoints
from hypersolid_scale.study.plan import Evaluation, PlannedRun
from hypersolid_scale.study.protocol import RunProgress, Study
from hypersolid_scale.study.state import StudyState

RESUMED = re.compile(r"resumed from \S+ at step (\d+)")  # the trainer's line when it resumes
STEPS_PER_EPOCH = re.compile(r"(\d+) steps/epoch")  # the trainer's first line
TICK_S = 30.0  # how often a running training's seconds are recorded and its unneeded checkpoints deleted
EXIT_PREEMPTED = 75  # the trainer's exit after a SIGTERM and its checkpoint


@dataclass
class Task:
    run: Any
    kind: str  # train | eval
    cmd: list[str]
    log: Path
    evaluation: Evaluation | None = None
    t0: float = 0.0
    log_start: int = 0  # where this attempt's output begins in its (appended) log
    pause_epoch: int = 0  # a staged training stops at this epoch's end (0: runs to the end)
    pause_step: int = 0
    per_epoch: int = 0  # steps per epoch, once the trainer has said it
    pausing: bool = False


@dataclass
class Prior:
    """Seconds before anything is measured: a child's start-up, an epoch, an evaluation (the budget's estimate)."""

    startup_s: float = 15.0
    epoch_s: float = 600.0
    eval_s: float = 180.0


def _end_with(parent: int) -> Callable[[], None]:
    def preexec() -> None:  # in the child, before exec
        if not die_with_parent(parent=parent, always=True):
            os._exit(EXIT_ORPHANED)

    return preexec


class Engine:
    def __init__(
        self,
        study: Study,
        state: StudyState,
        *,
        slots: int = 1,
        budget_s: float = 0.0,
        prior: Prior | None = None,
        grace_s: float = 300.0,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        progress: bool = True,
        say: Callable[[str], None] | None = None,
    ) -> None:
        if slots < 1:
            raise ValueError(f"slots {slots}: at least one")
        self.study, self.state, self.slots = study, state, slots
        self.t0 = time.monotonic()
        self.deadline = self.t0 + budget_s if budget_s else float("inf")
        p = prior or Prior()
        self.startup_s, self.epoch_s, self.eval_s = p.startup_s, p.epoch_s, p.eval_s
        self.measured = {"train": False, "eval": False}  # the first measure replaces the prior, later ones raise it
        self.grace_s, self.cwd = grace_s, cwd
        self.env = dict(os.environ if env is None else env)
        self.skipped: list[dict[str, Any]] = []  # {"run", "reason"}: what did not run, or did not finish
        self.failures: dict[str, str] = {}  # run name -> why it failed
        self.progress: dict[str, RunProgress] = {}
        self.active: dict[subprocess.Popen, Task] = {}
        self.evals: deque[Task] = deque()
        self.trains: deque[Task] = deque()
        self._last_tick = 0.0
        self.bar = tqdm(total=0, desc="study", unit="task", dynamic_ncols=True, disable=not progress)
        self._say = say

    # ---- helpers -----------------------------------------------------------------------------------------
    def say(self, msg: str) -> None:
        line = f"[{time.monotonic() - self.t0:6.0f}s] {msg}"
        if self._say is not None:
            self._say(line)
        else:
            tqdm.write(line)

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def estimate(self, run: PlannedRun) -> float:
        return self.startup_s + run.epochs * self.epoch_s + self.eval_s

    def skip(self, run: PlannedRun, reason: str) -> None:
        self.skipped.append({"run": run.name, "reason": reason})

    def fail(self, run: PlannedRun, reason: str, log: Path) -> None:
        self.failures.setdefault(run.name, reason)
        self.progress[run.name].failed = reason
        self.skip(run, reason)
        self.say(f"FAILED {run.name}: {reason} (log: {log})")

    def _queue(self, task: Task) -> None:
        (self.evals if task.kind == "eval" else self.trains).append(task)
        self.bar.total = (self.bar.total or 0) + 1
        self.bar.refresh()

    def _env(self, processes: int) -> dict[str, str]:
        env = dict(self.env)
        if "OMP_NUM_THREADS" not in env:  # N processes must not each take every core; the caller's setting wins
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // (self.slots * processes)))
        return env

    def launch(self, task: Task) -> None:
        task.log.parent.mkdir(parents=True, exist_ok=True)
        task.t0 = time.monotonic()
        processes = self.study.processes(task.run) if task.kind == "train" else 1
        env = self._env(processes)
        if task.kind == "train":
            self.state.start_attempt(task.run.name, env.get("OMP_NUM_THREADS"))
        with task.log.open("a") as log:
            log.write(f"$ {' '.join(task.cmd)}\n")
            log.flush()
            task.log_start = log.tell()
            proc = subprocess.Popen(
                task.cmd,
                cwd=self.cwd,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_end_with(os.getpid()),
            )
        self.active[proc] = task
        self.bar.set_postfix_str(f"{task.kind} {task.run.name}")

    def _text(self, task: Task) -> str:
        with task.log.open("rb") as f:
            f.seek(task.log_start)
            return f.read().decode(errors="replace")

    def steps_per_epoch(self, task: Task) -> int:
        """A training's steps per epoch, from the trainer's first line (0 until it is written)."""
        if not task.per_epoch and task.log.exists():
            found = STEPS_PER_EPOCH.search(self._text(task))
            task.per_epoch = int(found.group(1)) if found else 0
        return task.per_epoch

    # ---- per run -----------------------------------------------------------------------------------------
    def _next_pause(self, run: PlannedRun) -> int:
        trained_to = int(self.state.run(run.name).get("trained_to_epoch", 0))
        return next((e for e in run.pause_epochs if trained_to < e < run.epochs), 0)

    def _train_task(self, run: PlannedRun) -> Task:
        prog = self.progress[run.name]
        return Task(run, "train", prog.train_cmd, self.study.train_log(run), pause_epoch=self._next_pause(run))

    def every_tick(self) -> None:
        """Every TICK_S: record each running training's seconds so far, delete the checkpoints nothing will read,
        and stop a staged training whose pause checkpoint exists (the latter at every call)."""
        now = time.monotonic()
        tick = now - self._last_tick >= TICK_S
        for proc, task in self.active.items():
            if task.kind != "train":
                continue
            if task.pause_epoch and not task.pausing:
                task.pause_step = self.steps_per_epoch(task) * task.pause_epoch
                if task.pause_step and task.pause_step in checkpoints(self.study.run_dir(task.run)):
                    proc.terminate()  # it checkpoints and exits 75
                    task.pausing = True
            if tick:
                self.state.tick_attempt(task.run.name, now - task.t0)
                keep = self.study.keep_checkpoints(task.run, self.steps_per_epoch(task))
                if keep is not None and self.steps_per_epoch(task):
                    prune_checkpoints(self.study.run_dir(task.run), keep)
        if tick:
            self._last_tick = now
            if self.active:
                self.state.save()

    def queue_evals(self, prog: RunProgress, final: int, upto: int | None = None) -> None:
        evs, missing = self.study.evaluations(prog.run, final, upto)
        for why in missing:
            self.skip(prog.run, why)
        prog.pending += len(evs)  # every evaluation counted before a cached one is taken: one finish, with all
        for ev in evs:
            task = Task(prog.run, "eval", list(ev.cmd), self.study.eval_log(prog.run, ev), evaluation=ev)
            if self.state.eval_done(prog.run.name, ev.key) and ev.report.exists():
                self.eval_done(task, cached=True)
            else:
                self._queue(task)
        if prog.pending == 0:
            self._finish(prog)

    def _finish(self, prog: RunProgress) -> None:
        if not any(s["run"] == prog.run.name for s in self.skipped):
            self.study.finished(prog)

    def eval_done(self, task: Task, seconds: float = 0.0, cached: bool = False) -> None:
        prog, ev = self.progress[task.run.name], task.evaluation
        assert ev is not None
        if cached:
            seconds = float(self.state.run(task.run.name)["evals"][ev.key].get("eval_s", 0.0))
        else:
            self.state.record_eval(task.run.name, ev.key, "done", seconds)
            prog.eval_s += seconds
        prog.evaluated[ev.key] = (ev, json.loads(ev.report.read_text()), seconds)
        prog.pending -= 1
        if prog.pending == 0:
            self._finish(prog)

    def paused(self, task: Task, seconds: float) -> None:
        prog, rec = self.progress[task.run.name], self.state.run(task.run.name)
        self.state.end_attempt(task.run.name, seconds)
        rec["trained_to_epoch"] = task.pause_epoch
        self.state.save()
        self.say(f"paused {task.run.name} after epoch {task.pause_epoch} ({seconds:.0f}s); it resumes later")
        prog.stage_epoch = task.pause_epoch
        self.queue_evals(prog, task.pause_step, upto=task.pause_epoch)
        self._queue(self._train_task(task.run))  # the next stage, after every training queued now

    def reaped(self, proc: subprocess.Popen, task: Task) -> None:
        seconds, rc = time.monotonic() - task.t0, proc.returncode
        self.bar.update()
        prog = self.progress[task.run.name]
        if task.kind == "eval":
            ev = task.evaluation
            assert ev is not None
            # Exit 3 (every metric skipped) still writes a report: the skips are the result.
            if rc in (0, 3) and ev.report.exists() and ev.report.stat().st_mtime >= time.time() - seconds - 1:
                self.eval_s = max(self.eval_s, seconds) if self.measured["eval"] else seconds
                self.measured["eval"] = True
                self.eval_done(task, seconds)
                return
            self.state.record_eval(task.run.name, ev.key, f"failed (exit {rc})", seconds)
            prog.pending -= 1
            self.fail(task.run, f"evaluation of step {ev.step} failed (exit {rc}): {last_error(task.log)}", task.log)
            return
        prog.train_s = seconds
        if task.pausing and rc in (0, EXIT_PREEMPTED):
            self.paused(task, seconds)
            return
        prog.stage_epoch = 0
        rec = self.state.run(task.run.name)
        total = self.state.end_attempt(task.run.name, seconds)
        final = max(checkpoints(self.study.run_dir(task.run)), default=0)
        problem = (
            f"training failed (exit {rc}): {last_error(task.log, task.log_start)}"
            if rc != 0
            else self.study.trained_error(task.run, final)
        )
        if problem:
            rec["train"] = f"failed (exit {rc})"
            self.state.save()
            self.fail(task.run, problem, task.log)
            return
        resumed = RESUMED.findall(self._text(task))
        start = int(resumed[-1]) if resumed else 0
        if task.run.epochs and final > start:  # one step, or a resumed end, says nothing about an epoch's time
            per_epoch_s = max(0.0, seconds - self.startup_s) * final / (final - start) / task.run.epochs
            self.epoch_s = max(self.epoch_s, per_epoch_s) if self.measured["train"] else per_epoch_s
            self.measured["train"] = True
        rec.update(train="done", final_step=final, resumed_from_step=start if resumed else None)
        self.state.save()
        self.say(f"trained {task.run.name} to step {final} ({seconds:.0f}s, {total:.0f}s over its attempts)")
        self.queue_evals(prog, final)

    # ---- the loop ----------------------------------------------------------------------------------------
    def stages_done(self, run: PlannedRun) -> int:
        """How many of the run's pauses it has passed (the state file's ``trained_to_epoch``)."""
        trained_to = int(self.state.run(run.name).get("trained_to_epoch", 0))
        return sum(e <= trained_to for e in run.pause_epochs)

    def queue_plan(self, runs: list[Any]) -> None:
        """Queue what is left of ``runs``: the evaluations of the trained ones, and the trainings in plan order
        within each stage, the earlier stages first. A restarted study thus keeps the stages' promise (every run
        reaches a stage before any goes on), as one that never stopped does by queueing a paused run's next stage
        last."""
        trains = []
        for run in runs:
            if self.study.is_finished(run):
                self.say(f"skip {run.name}: result exists")
                continue
            rec = self.state.run(run.name)
            self.progress[run.name] = RunProgress(run, rec, self.study.train_command(run))
            if self.study.is_trained(run, rec):
                final = rec.get("final_step", max(checkpoints(self.study.run_dir(run)), default=0))
                self.queue_evals(self.progress[run.name], int(final))
            else:
                trains.append(run)
        for run in sorted(trains, key=self.stages_done):  # a stable sort: plan order within a stage
            self._queue(self._train_task(run))

    def run(self, runs: list[Any]) -> int:
        """Run the plan; 0 when everything ran, 1 when a training or an evaluation failed."""
        self.queue_plan(runs)
        try:
            while self.trains or self.evals or self.active:
                for proc, task in list(self.active.items()):
                    if proc.poll() is not None:
                        del self.active[proc]
                        self.reaped(proc, task)
                # Evaluations first (they turn finished trainings into results), then trainings; whatever would
                # end past the budget is skipped now, not queued, so the loop ends once the budget is reached.
                while len(self.active) < self.slots and (self.evals or self.trains):
                    t = self.evals.popleft() if self.evals else self.trains.popleft()
                    if t.kind == "train" and self.progress[t.run.name].failed:
                        continue
                    need = self.eval_s if t.kind == "eval" else self.estimate(t.run)
                    if self.left() > need:
                        self.launch(t)
                    elif t.kind == "eval":
                        self.skip(t.run, f"budget: trained, step {t.evaluation.step} not evaluated (rerun to evaluate)")  # type: ignore[union-attr]
                    else:
                        self.skip(t.run, f"budget: needs ~{need:.0f}s, {self.left():.0f}s left")
                self.every_tick()
                time.sleep(0.2)
        finally:
            self.stop_children()
            for t in self.trains:
                self.skip(t.run, "interrupted before training")
            self.trains.clear()
            self.evals.clear()
            self.bar.close()
        return 1 if self.failures else 0

    def stop_children(self) -> None:
        """SIGTERM: a training checkpoints and exits 75, so a rerun resumes where it stopped."""
        for proc in self.active:
            proc.terminate()
        end = time.monotonic() + self.grace_s
        for proc, task in self.active.items():
            try:
                proc.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if task.kind == "train":
                self.state.end_attempt(task.run.name, time.monotonic() - task.t0)
            self.skip(task.run, f"interrupted during {task.kind}")
        self.active.clear()
