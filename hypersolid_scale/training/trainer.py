"""Self-supervised pre-training (Hypersolid or a baseline, ``method.name``), top to bottom: ``build(cfg)``
then ``train_step`` in a loop; one step function for every method.

    torchrun --nproc_per_node=2 launch/train.py --config configs/quickstart.yaml optim.lr=3e-4

One process per device (torchrun or srun). The method's loss sees the GLOBAL batch (Hypersolid's repulsion
gathers the detached embeddings of every rank) and hands each rank P x its share of the gradient, so the
engine's gradient averaging reproduces single-process training on the concatenated batch (docs/design.md §3).

No host synchronisation per step. Reading a CUDA value on the host (``float(t)``, ``bool(t)``, ``.item()``)
waits for the GPU to finish everything queued, which starves it while the host prepares the next step. So
``train_step`` returns its statistics as one packed device tensor (the method's statistics over the global
batch, plus lr and grad norm), and Python floats are made only on logging
steps (every ``tracking.log_every_n_steps`` and step 1) and at epoch summaries, one transfer each. Step
time and throughput are measured over the window between two logging steps, where the host has waited
for the GPU, rather than per step, where the host clock only sees kernel launches. Values the host must act
on every step (the preemption vote across ranks) are copied to pinned memory without blocking and read
one step later (``HostValue``), by which time the GPU has long produced them.

Non-finite values: a serious trainer cannot afford a sync before every ``optimizer.step()``, so the check
is deferred, and what it protects is the checkpoint. Every step records, on the device, whether its
statistics (loss, its terms, the grad norm, and the loss's count of non-finite embedding values, all
identical on every rank) are finite, and remembers the first step that was not (``NonFiniteGuard``). The
record is read at every logging step, at epoch ends and before EVERY checkpoint save; a bad record raises
``NonFiniteLossError`` naming that step. So a checkpoint is never written after a non-finite step: the
parameters that the optimizer may have updated with bad gradients in between are only in memory and die
with the process, and the newest checkpoint on disk is the last good state.

Exit codes: 0 finished; 75 (EX_TEMPFAIL) preempted by SIGUSR1/SIGTERM after writing a checkpoint, requeue
me; 2 a problem with the input (run_dir locked by another live training, a bad config, missing data, an
unusable checkpoint, a full disk, a tracking URI that cannot work: ``UserError``, one line); 69 another rank or
node vanished (``dist.peer_timeout_s``, distributed/heartbeat.py: one line naming it); anything else is an error
(a non-finite loss raises and leaves the last good checkpoint intact).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from tqdm import tqdm

from hypersolid_scale import checkpoint as ckpt_lib
from hypersolid_scale.config.nested import flatten
from hypersolid_scale.config.schema import Config, load_config, save_config, to_dict
from hypersolid_scale.distributed import (
    WorldInfo,
    barrier,
    broadcast_object,
    cleanup,
    elastic_restart,
    init_distributed,
    start_heartbeat,
)
from hypersolid_scale.methods import method_names
from hypersolid_scale.methods.config import DEFAULT_METHOD
from hypersolid_scale.methods.params import section_tags
from hypersolid_scale.safety.errors import EXIT_BAD_INPUT, UserError, report
from hypersolid_scale.safety.lifeline import EXIT_ORPHANED, die_with_parent
from hypersolid_scale.safety.preemption import EXIT_PREEMPTED, preemption_handlers, stop_requested
from hypersolid_scale.safety.process_exit import exit_process
from hypersolid_scale.safety.run_lock import RunDirLocked, RunLock, acquire_run_lock
from hypersolid_scale.tracking import Tracker, make_tracker
from hypersolid_scale.training.checkpointer import Checkpointer
from hypersolid_scale.training.epoch_end import Decision, EpochEnd
from hypersolid_scale.training.epoch_report import memory_gb, plot_loss
from hypersolid_scale.training.run_builder import Run, batch_lines, build, on_every_rank, seed_everything
from hypersolid_scale.training.step import train_step
from hypersolid_scale.training.step_bookkeeping import (
    EpochMeter,
    NonFiniteLossError,
    StopVote,
    loggable,
)

__all__ = [
    "EXIT_PREEMPTED",
    "EXIT_RUN_DIR_LOCKED",
    "NonFiniteLossError",
    "Run",
    "build",
    "main",
    "seed_everything",
    "train",
    "train_loop",
    "train_step",
]

EXIT_RUN_DIR_LOCKED = EXIT_BAD_INPUT  # another live training holds run_dir/.lock; nothing was read or written


# ----------------------------------------------------------------------------------------------------------
# Set-up and main loop
# ----------------------------------------------------------------------------------------------------------


def _lock_run_dir(cfg: Config, info: WorldInfo) -> tuple[RunLock | None, str | None]:
    """Rank 0 takes run_dir's lock and every rank hears the outcome: (the lock on rank 0, the refusal)."""
    lock, refusal = None, None
    if info.rank == 0:
        try:
            lock = acquire_run_lock(cfg.run_dir)
        except RunDirLocked as err:
            refusal = str(err)
        except OSError as err:  # unwritable run_dir, or a filesystem without flock (Lustre without -o flock)
            refusal = (
                f"cannot lock run_dir {cfg.run_dir} ({err}); use a writable run_dir on a filesystem "
                "with flock support (local disk, NFSv4, Lustre mounted with -o flock, GPFS)"
            )
    return lock, broadcast_object(refusal)  # type: ignore[return-value]


def train(cfg: Config, *, early_signals: Sequence[int] = ()) -> int:
    """Set up the process group, lock run_dir, build or resume the run, train; returns the exit code.

    0 finished, 75 preempted (checkpoint written), 2 run_dir locked by another live training (nothing read
    or written) or not lockable. Other user errors raise ``UserError`` (``errors.run_cli`` reports them).
    ``early_signals``: preemption signals received before training (see ``preemption.preemption_handlers``).
    """
    info, device = init_distributed(cfg.dist.device, cfg.dist.transport, cfg.dist.timeout_minutes)
    # From here a dead launcher means "checkpoint and stop" (launch/train.py killed us outright before the
    # process group was up); the parent died in between if the kernel no longer sees it.
    if not die_with_parent(signal.SIGTERM):
        cleanup()
        print("error: the launcher (torchrun / srun) exited while this worker started; exiting", file=sys.stderr)
        return EXIT_ORPHANED
    # A vanished peer (a node killed, powered off or cut off) stops this rank within dist.peer_timeout_s.
    heartbeat = start_heartbeat(cfg.dist.peer_timeout_s, lambda: _newest_checkpoint(cfg))
    restart = elastic_restart()
    if restart is not None and info.rank == 0:  # torchrun --max-restarts restarted the group after a failure
        print(
            f"[hypersolid] torchrun restart {restart[0]} of {restart[1]} (TORCHELASTIC_RESTART_COUNT / "
            "TORCHELASTIC_MAX_RESTARTS): resuming from the newest complete checkpoint, if any",
            flush=True,
        )
    lock: RunLock | None = None
    try:
        with preemption_handlers(early_signals):
            try:
                # One writer per run directory, decided before anything in it is read or written (resume
                # scan, *.tmp cleanup, config.yaml, tracking); no rank may wait in a collective for one that left.
                lock, refusal = _lock_run_dir(cfg, info)
                if refusal is not None:
                    if info.rank == 0:
                        print(f"error: {refusal}", file=sys.stderr, flush=True)
                    barrier()  # leave together: torchrun stops the remaining workers as soon as one has exited
                    return EXIT_RUN_DIR_LOCKED
                return _resume_or_start(cfg, info, device)
            except UserError as err:
                # Reported now, while the SIGTERM that torchrun sends once another rank has exited is only
                # recorded: after the handlers are restored it would kill this rank before it has printed.
                report(err)
                raise
            except BaseException as err:
                if heartbeat is not None:  # a collective failed because a peer vanished: name it (and exit)
                    heartbeat.explain(err)
                raise
    finally:
        if heartbeat is not None:
            heartbeat.stop()
        cleanup()
        if lock is not None:
            lock.release()


def _newest_checkpoint(cfg: Config) -> str:
    """Where a rerun of the run resumes: the last sentence of the line that reports a lost peer."""
    saved = ckpt_lib.list_checkpoints(cfg.run_dir)
    return f"Newest checkpoint: {saved[-1]}; a rerun resumes from it." if saved else "No checkpoint yet."


def _resume_or_start(cfg: Config, info: WorldInfo, device: torch.device) -> int:
    seed_everything(cfg.seed, cfg.deterministic)
    ckpt = ckpt_lib.resolve_resume(cfg)
    run = build(cfg, info, device)
    step, epoch = (
        (0, 0)
        if ckpt is None
        else ckpt_lib.restore_run_state(
            ckpt,
            engine=run.engine,
            loader=run.loader,
            rank=info.rank,
            world_size=info.world_size,
            global_batch=run.batch.global_batch,
            steps_per_epoch=run.steps_per_epoch,
            force=cfg.checkpoint.resume == "force",
        )
    )
    # The tracker first: a tracking URI that cannot work stops the run before anything is written (a store
    # that is down does not stop it: the records wait in the spool).
    tags = {
        "world_size": info.world_size,
        "transport": run.transport,
        "engine": cfg.dist.engine,
        "device": device.type,
        "launcher": info.launcher,
        "method": cfg.method.name,
        "precision": run.precision,
        **section_tags(cfg.method.section()),
    }
    resume_id = ckpt.get("mlflow_run_id") if ckpt else None
    tracker = on_every_rank(
        lambda: make_tracker(cfg.tracking, cfg.run_dir, rank=info.rank, resume_run_id=resume_id, tags=tags), info.rank
    )
    return _start(run, tracker, ckpt, step, epoch)


def _start(run: Run, tracker: Tracker, ckpt: dict | None, step: int, epoch: int) -> int:
    """Write the run's first files (old checkpoints aside, config.yaml, params) and train."""
    cfg, info = run.cfg, run.info
    try:
        if cfg.checkpoint.resume == "never":
            ckpt_lib.set_aside_checkpoints(cfg.run_dir)
        if info.rank == 0:
            save_config(cfg, cfg.run_dir)
        if ckpt is None:
            # the chosen method's and format's sections only; which photometric chain the stage runs and what
            # dist.compile compiles (and why)
            params = {**flatten(to_dict(cfg, stored=True)), **_stage_params(run), **run.compile_scope.params()}
            tracker.log_params(params)
        tracker.log_artifact(Path(cfg.run_dir) / "config.yaml")
    except BaseException:
        tracker.close(status="FAILED")
        raise
    if info.rank == 0:
        where = f"resumed from {ckpt['path']} at step {step}" if ckpt else "starting from scratch"
        print(
            f"[hypersolid] training method.name={cfg.method.name}: {info.world_size} process(es), "
            f"{cfg.dist.engine}/{run.transport}, "
            f"device={run.device.type}, precision={run.precision}, {run.steps_per_epoch} steps/epoch, "
            f"{run.total_steps} steps total; {where}",
            flush=True,
        )
        for name, value in _stage_params(run).items():
            print(f"[hypersolid] {name}: {value}", flush=True)
        for line in batch_lines(run):
            print(line, file=sys.stderr if line.startswith("warning:") else sys.stdout, flush=True)
    return train_loop(run, tracker, step, epoch, resumed=ckpt is not None)


def _stage_params(run: Run) -> dict[str, str]:
    """What the run records of its device stage (data.views_on=device): which photometric chain runs, and why."""
    stage = run.loader.device_stage
    return {} if stage is None else {"data.photometric_chain": stage.photometric.chain}


def train_loop(run: Run, tracker: Tracker, step: int, epoch: int, *, resumed: bool) -> int:
    """Epochs of train_step with logging, checkpoints, the online monitor and preemption checks.

    Host synchronisations happen only on logging steps, at epoch ends and at checkpoints (see the module
    docstring); every other step only queues work.
    """
    cfg, device, rank0 = run.cfg, run.device, run.info.rank == 0
    global_batch = run.batch.global_batch
    bar = tqdm(
        total=run.total_steps,
        initial=step,
        disable=not (rank0 and cfg.progress),
        dynamic_ncols=True,
        desc="train",
        unit="step",
    )
    status = "FAILED"
    stop = StopVote(device)
    checkpoint = Checkpointer(run, tracker, last_saved=step if resumed else -1)
    end_epoch = EpochEnd(run, tracker, bar, stop, checkpoint)  # the monitor, checkpoint and stop decisions
    try:
        while step < run.total_steps and epoch < cfg.epochs:
            run.loader.set_epoch(epoch)
            run.engine.train(True)
            meter = EpochMeter(run.steps_per_epoch, device)
            preempted, t_last = False, time.perf_counter()
            for views, _labels in run.loader:
                t_data = time.perf_counter() - t_last
                # bf16 views (the device stage's, for a bf16 step) stay bf16: autocast would cast them to it.
                dtype = torch.bfloat16 if run.bf16 and views[0].dtype == torch.bfloat16 else run.dtype
                views = [v.to(device, dtype, non_blocking=True, memory_format=run.memory_format) for v in views]
                stats = train_step(run, views, step)
                step += 1
                meter.add(stats, t_data)
                if step % cfg.tracking.log_every_n_steps == 0 or step == 1:
                    values = stats.to_dict()  # the logging step's one host transfer
                    run.guard.check()
                    values = {**loggable(values), **meter.window(global_batch)}
                    tracker.log_metrics(
                        {
                            **{f"train/{k}": v for k, v in values.items()},
                            "train/epoch": epoch,
                            "train/mem_gb": memory_gb(device),
                        },
                        step=step,
                    )
                    bar.set_postfix(loss=f"{values['loss']:.4f}", img_s=f"{values['images_per_s']:.0f}", ep=epoch)
                bar.update(1)
                if checkpoint(step):
                    end_epoch.record_part(epoch, step, meter)
                if stop(stop_requested()):
                    preempted = True
                    break
                if step >= run.total_steps:
                    break
                t_last = time.perf_counter()
            decision = end_epoch(epoch, step, meter, preempted=preempted)
            if decision is Decision.PREEMPTED:
                status = "KILLED"
                return EXIT_PREEMPTED
            if decision is Decision.FINISHED:
                break
            epoch += 1
        if rank0 and end_epoch.history:
            tracker.log_artifact(plot_loss(end_epoch.history, Path(cfg.run_dir) / "plots" / "loss.png"))
        status = "FINISHED"
        return 0
    finally:
        try:
            if status != "FAILED":  # a save still in flight is the run's newest checkpoint: wait for it
                checkpoint.close()
        finally:
            run.loader.close()  # the run's DataLoader workers and stage thread
            bar.close()
            tracker.close(status=status)


def parse_args(argv: list[str] | None) -> tuple[str | None, list[str]]:
    parser = argparse.ArgumentParser(
        description="Self-supervised pre-training of the method the config names (method.name: "
        f"{', '.join(method_names())}; default {DEFAULT_METHOD}); run under torchrun or srun for several processes."
    )
    parser.add_argument("--config", default=None, help="YAML config (configs/*.yaml); defaults if omitted")
    parser.add_argument("overrides", nargs="*", help="section.key=value overrides, e.g. optim.lr=1e-3")
    args = parser.parse_args(argv)
    return args.config, args.overrides


def main(
    argv: list[str] | None = None,
    *,
    early_signals: Sequence[int] = (),
    on_config: Callable[[Config], None] | None = None,
) -> int:
    """Parse, validate (before any work), train. Returns the process exit code.

    ``early_signals``: preemption signals received before this call, as a list that may still grow until
    the trainer's own handlers are installed (launch/train.py records them during its imports); the run
    then stops with a checkpoint after its first step. ``on_config`` is called with the validated Config
    before training starts (an entry point learns where the run's log files go).
    """
    path, overrides = parse_args(argv)
    cfg = load_config(path, overrides)
    if on_config is not None:
        on_config(cfg)
    return train(cfg, early_signals=early_signals)


if __name__ == "__main__":
    exit_process(main())
