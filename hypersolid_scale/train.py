"""Hypersolid pre-training, top to bottom: ``build(cfg)`` then ``train_step`` in a loop.

    torchrun --nproc_per_node=2 launch/train.py --config configs/quickstart.yaml optim.lr=3e-4

One process per device (torchrun or srun). The loss sees the GLOBAL batch (its repulsion gathers the
detached embeddings of every rank) and hands each rank P x its share of the gradient, so the engine's
gradient averaging reproduces single-process training on the concatenated batch (docs/design.md §3).

No host synchronisation per step. Reading a CUDA value on the host (``float(t)``, ``bool(t)``, ``.item()``)
waits for the GPU to finish everything queued, which starves it while the host prepares the next step. So
``train_step`` returns its statistics as one packed device tensor (the loss's statistics, reduced across
ranks in the loss's single collective, plus lr and grad norm), and Python floats are made only on logging
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
with the process, and the newest checkpoint on disk is the last good state. (A device-side skip of the
update, e.g. zeroing gradients with ``torch.where``, would still move AdamW's moments and step count and
DeepSpeed ZeRO keeps its own gradient buffers; since training stops anyway, it would protect nothing that
the deferred check does not.)

Exit codes: 0 finished; 75 (EX_TEMPFAIL) preempted by SIGUSR1/SIGTERM after writing a checkpoint, requeue
me; 2 run_dir is locked by another live training (or a bad config); anything else is an error (a
non-finite loss raises and leaves the last good checkpoint intact).
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from hypersolid_scale import checkpoint as ckpt_lib
from hypersolid_scale.config import Config, fingerprint, load_config, save_config, to_dict
from hypersolid_scale.data import build_train_loader, in_channels
from hypersolid_scale.distributed import all_reduce_sum, barrier
from hypersolid_scale.distributed.engines import Engine, build_engine
from hypersolid_scale.distributed.env import (WorldInfo, all_reduce_max_flag, broadcast_object, cleanup,
                                              gather_objects, init_distributed, resolve_backend)
from hypersolid_scale.losses import HypersolidLoss, PackedStats
from hypersolid_scale.nested import flatten
from hypersolid_scale.optim import lr_schedule, optimizer_factory
from hypersolid_scale.models import build_model
from hypersolid_scale.run_lock import RunDirLocked, RunLock, acquire_run_lock
from hypersolid_scale.step_monitor import NonFiniteLossError  # noqa: F401  (raised by the guard; caught from here)
from hypersolid_scale.step_monitor import EpochMeter, NonFiniteGuard, StopVote, loggable
from hypersolid_scale.tracking import Tracker, make_tracker

EXIT_PREEMPTED = 75  # EX_TEMPFAIL: checkpoint written, requeue the job
EXIT_RUN_DIR_LOCKED = 2  # another live training holds run_dir/.lock; nothing was read or written


# ----------------------------------------------------------------------------------------------------------
# Setup: seeds, determinism, precision
# ----------------------------------------------------------------------------------------------------------


def seed_everything(seed: int, deterministic: bool) -> None:
    """Same seed on every rank: the model initialises identically; the loaders derive per-rank streams."""
    import random

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if deterministic:
        # cuBLAS needs this before its first call to pick deterministic reductions.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False
        # warn_only: a kernel without a deterministic variant warns (once) instead of stopping a long run.
        torch.use_deterministic_algorithms(True, warn_only=True)
    else:
        torch.backends.cudnn.benchmark = True


def resolve_bf16(setting: str, device: torch.device) -> bool:
    if setting == "auto":
        return device.type == "cuda" and torch.cuda.is_bf16_supported()
    return setting == "true"


# ----------------------------------------------------------------------------------------------------------
# Build: everything a run needs, in one plain container
# ----------------------------------------------------------------------------------------------------------


@dataclass
class Run:
    cfg: Config
    info: WorldInfo
    device: torch.device
    engine: Engine
    loss_fn: HypersolidLoss
    loader: Any
    lr: np.ndarray
    steps_per_epoch: int
    total_steps: int
    bf16: bool
    backend: str
    guard: NonFiniteGuard | None = None

    def __post_init__(self) -> None:
        if self.guard is None:
            self.guard = NonFiniteGuard(self.device, self.cfg.run_dir)


def build(cfg: Config, info: WorldInfo, device: torch.device) -> Run:
    """Model, engine (DDP | DeepSpeed) + optimizer, loss, loader and schedule. Collective under torchrun."""
    channels = in_channels(cfg.data)
    if cfg.model.in_channels != channels:
        raise ValueError(f"model.in_channels={cfg.model.in_channels} but the data has {channels} channel(s) "
                         f"(data.dataset={cfg.data.dataset!r}); set model.in_channels={channels}")
    bf16 = resolve_bf16(cfg.dist.bf16, device)
    model = build_model(cfg.model)  # identical on every rank: the seed was set just before
    o = cfg.optim
    engine = build_engine(model, optimizer_factory(o), engine=cfg.dist.engine, device=device, bf16=bf16,
                          grad_clip=o.grad_clip, sync_bn=cfg.dist.sync_bn, compile=cfg.dist.compile,
                          zero_stage=cfg.dist.zero_stage, batch_size_per_gpu=cfg.data.batch_size_per_gpu)
    loader = build_train_loader(cfg.data, rank=info.rank, world_size=info.world_size, seed=cfg.seed, device=device)
    steps_per_epoch = len(loader)
    if steps_per_epoch < 1:
        raise ValueError(f"the training set gives no full batch of data.batch_size_per_gpu="
                         f"{cfg.data.batch_size_per_gpu} per rank on {info.world_size} rank(s); lower the batch size")
    total = cfg.epochs * steps_per_epoch
    if cfg.max_steps > 0:
        total = min(total, cfg.max_steps)
    backend = resolve_backend(cfg.dist.backend, device) if info.world_size > 1 else "none"
    # Sync-free loss: non-finite input is caught by the guard, and every rank's batch has the same size
    # (data.batch_size_per_gpu, full batches only), so the all_gather needs no size exchange.
    loss_fn = HypersolidLoss.from_config(cfg.loss, check_finite=False, same_rows_per_rank=True).to(device)
    lrs = lr_schedule(o, epochs=cfg.epochs, max_steps=cfg.max_steps, steps_per_epoch=steps_per_epoch)
    return Run(cfg, info, device, engine, loss_fn, loader, lrs, steps_per_epoch,
               total, bf16, backend)


# ----------------------------------------------------------------------------------------------------------
# Checkpoints: what goes in, what comes back
# ----------------------------------------------------------------------------------------------------------


def save(run: Run, step: int, tracker: Tracker) -> Path | None:
    """Collective: every rank contributes its RNG state (and ZeRO shard); rank 0 writes the file.

    ``epoch`` is the loader's epoch (in progress, or just finished when its position is at the end).
    Raises :class:`NonFiniteLossError` instead of saving if any step so far was not finite.
    """
    run.guard.check()  # never a checkpoint after a non-finite step
    tracker.flush()  # the metrics up to this step are durable before the checkpoint that claims them
    loader_state = run.loader.state_dict()
    optim_state = run.engine.optimizer_state()
    rngs = gather_objects(ckpt_lib.rng_state())
    path = None
    if run.info.rank == 0:
        state = {
            "model": {k: (v.float() if v.is_floating_point() else v).cpu()
                      for k, v in run.engine.model.state_dict().items()},
            "optimizer": optim_state,
            "scheduler": {"kind": run.cfg.optim.schedule, "step": step, "lr": float(run.lr[min(step, len(run.lr) - 1)])},
            "step": step,
            "epoch": int(loader_state["epoch"]),
            "rng": rngs,  # one state per rank, rank order
            "loader": loader_state,
            "config": to_dict(run.cfg),
            "config_fingerprint": fingerprint(run.cfg),
            "mlflow_run_id": tracker.run_id,
            "tracking_uri": tracker.tracking_uri,
            "world_size": run.info.world_size,
        }
        path = ckpt_lib.save_checkpoint(run.cfg.run_dir, state, keep_last=run.cfg.checkpoint.keep_last)
    barrier()
    return path


def restore(run: Run, ckpt: dict[str, Any]) -> tuple[int, int]:
    """Load weights, optimizer, RNG and loader position; returns (step, epoch) to continue from."""
    saved_world = int(ckpt.get("world_size", run.info.world_size))
    if saved_world != run.info.world_size:
        # Steps, the loader position and the LR schedule count global batches of the old world size.
        if run.cfg.checkpoint.resume != "force":
            raise ValueError(
                f"checkpoint {ckpt.get('path', '')} was written by {saved_world} process(es), this run has "
                f"{run.info.world_size}: the global batch, the step count and the loader position would not "
                f"match. Resume with {saved_world} process(es), or pass checkpoint.resume=force to continue "
                "from the start of the checkpoint's epoch with the new world size.")
        epoch = int(ckpt["epoch"])
        warnings.warn(f"checkpoint.resume=force: world size {saved_world} -> {run.info.world_size}; restarting "
                      f"epoch {epoch} at step {epoch * run.steps_per_epoch}", stacklevel=2)
        run.engine.load_model_state(ckpt["model"])
        return epoch * run.steps_per_epoch, epoch
    run.engine.load_model_state(ckpt["model"])
    if ckpt.get("optimizer") is not None:
        try:
            run.engine.load_optimizer_state(ckpt["optimizer"])
        except ValueError:
            if run.cfg.checkpoint.resume != "force":
                raise
            warnings.warn("checkpoint.resume=force: optimizer state not restored (layout differs)", stacklevel=2)
    rngs = ckpt.get("rng") or []
    if len(rngs) == run.info.world_size:
        ckpt_lib.set_rng_state(rngs[run.info.rank])
    step, epoch = int(ckpt["step"]), int(ckpt["epoch"])
    loader_state = ckpt.get("loader")
    if loader_state is not None:
        run.loader.load_state_dict(loader_state)
        if int(loader_state.get("batches_done", 0)) >= run.steps_per_epoch:
            epoch += 1  # saved at the end of an epoch: continue with the next one
    return step, epoch


# ----------------------------------------------------------------------------------------------------------
# Online monitor: kNN top-1 on the held-out split
# ----------------------------------------------------------------------------------------------------------


def knn_monitor(run: Run) -> dict[str, float]:
    """kNN accuracy of backbone features (eval transform) on a subsample; collective, result on rank 0."""
    from torch.utils.data import Subset

    from hypersolid_scale.data import build_eval_datasets
    from hypersolid_scale.eval import extract_embeddings, knn_accuracy

    ev = run.cfg.eval
    train_ds, test_ds = build_eval_datasets(run.cfg.data)
    gen = np.random.default_rng(ev.seed)

    def cap(ds: Any, n: int) -> Any:
        return ds if len(ds) <= n else Subset(ds, sorted(gen.choice(len(ds), n, replace=False).tolist()))

    model = run.engine.model
    model.eval()
    try:
        kw = dict(batch_size=ev.batch_size, device=run.device, which=ev.features, progress=False)
        tr_f, tr_y = extract_embeddings(model, cap(train_ds, ev.monitor_max_train), **kw)
        te_f, te_y = extract_embeddings(model, cap(test_ds, ev.monitor_max_train), **kw)
    finally:
        model.train()
    if run.info.rank != 0:
        return {}
    acc = knn_accuracy(tr_f, tr_y, te_f, te_y, ks=tuple(ev.knn_k), temperature=ev.knn_temperature)
    return {f"monitor/{k}": v for k, v in acc.items()}


def log_monitor(run: Run, tracker: Tracker, bar: tqdm, epoch: int, step: int) -> bool:
    """Run and log the kNN monitor; False when the data cannot support it (then it stays off)."""
    error: ValueError | None = None
    try:
        acc = knn_monitor(run)
    except ValueError as err:  # e.g. a dataset without labels, or K larger than the monitor's sample
        error, acc = err, {}
    # Only rank 0 scores the kNN, so only it can fail there: every rank must still take the same decision,
    # or the next epoch's embedding all-gather would meet a rank that is training.
    if all_reduce_max_flag(error is not None):
        warnings.warn(f"online kNN monitor disabled: {error or 'it failed on rank 0'}", stacklevel=1)
        return False
    if acc:
        tracker.log_metrics(acc, step=step)
        bar.write(f"epoch {epoch:3d} | step {step:7d} | " + " | ".join(f"{k} {v:.2f}" for k, v in acc.items()))
    return True


# ----------------------------------------------------------------------------------------------------------
# One optimizer step
# ----------------------------------------------------------------------------------------------------------


def train_step(run: Run, views: list[torch.Tensor], step: int) -> PackedStats:
    """Forward all views, global-batch loss, backward, (clip,) step: no host synchronisation.

    Returns the step's statistics on the device (the loss's, then lr and grad_norm); read them with
    ``.to_dict()`` only where floats are needed. The finiteness of the step is recorded in ``run.guard``.
    """
    lr = float(run.lr[min(step, len(run.lr) - 1)])  # a host array: no device involved
    for group in run.engine.param_groups:
        group["lr"] = lr
    feats = run.engine.forward(views)  # (B, V, D) float32
    if feats.shape[0] != run.cfg.data.batch_size_per_gpu:
        # The loss's all_gather trusts equal per-rank batches (no size exchange): a short batch is a bug.
        raise RuntimeError(f"rank {run.info.rank} got a batch of {feats.shape[0]} images at step {step}, expected "
                           f"data.batch_size_per_gpu={run.cfg.data.batch_size_per_gpu}; the training loader must "
                           "yield full batches only")
    loss = run.loss_fn(feats)
    run.engine.backward(loss)
    grad_norm = run.engine.step()
    stats: dict[str, torch.Tensor | float] = {"lr": lr}
    if grad_norm is not None:
        stats["grad_norm"] = grad_norm
    packed = run.loss_fn.packed_stats.extend(stats)
    run.guard.record(step, packed)
    return packed


def summed_loader_stats(run: Run) -> dict[str, float]:
    """The loader's counters (corrupt samples skipped, samples lost, short or truncated shards, ...) summed
    over ranks: each rank reads its own shards, so rank 0's own counts would hide the others' losses.
    Collective. Every loader reports the same keys on every rank."""
    keys = sorted(run.loader.stats)
    if not keys:
        return {}
    values = torch.tensor([float(run.loader.stats[k]) for k in keys], dtype=torch.float64, device=run.device)
    return dict(zip(keys, all_reduce_sum(values).tolist()))


def memory_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB


# ----------------------------------------------------------------------------------------------------------
# Preemption: SIGUSR1 / SIGTERM -> finish the step, checkpoint, exit 75
# ----------------------------------------------------------------------------------------------------------

_STOP: dict[str, int | None] = {"signal": None}


def _on_signal(signum: int, _frame: Any) -> None:
    _STOP["signal"] = signum


def install_preemption_handlers() -> dict[int, Any]:
    """Returns the previous handlers, restored when training ends (main() may run inside another program).

    A signal already recorded (launch/train.py catches them during the slow imports) is kept: the run then
    takes one step, checkpoints and exits 75 instead of dying before its first checkpoint.
    """
    return {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGUSR1, signal.SIGTERM)}


# ----------------------------------------------------------------------------------------------------------
# Main loop
# ----------------------------------------------------------------------------------------------------------


def plot_loss(history: list[tuple[int, float]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    steps, losses = zip(*history)
    ax.plot(steps, losses)
    ax.set(xlabel="step", ylabel="loss", title="Hypersolid training loss")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def train(cfg: Config) -> int:
    """Set up the process group, lock run_dir, build or resume the run, train; returns the exit code.

    0 finished, 75 preempted (checkpoint written), 2 run_dir locked by another live training (nothing read
    or written) or not lockable.
    """
    info, device = init_distributed(cfg.dist.device, cfg.dist.backend, cfg.dist.timeout_minutes)
    previous_handlers = install_preemption_handlers()
    lock: RunLock | None = None
    try:
        # One writer per run directory, decided before anything in it is read or written (resume scan, *.tmp
        # cleanup, config.yaml, tracking). Rank 0 decides and every rank hears it, so that no rank waits in a
        # collective for a rank that has left.
        refusal: str | None = None
        if info.rank == 0:
            try:
                lock = acquire_run_lock(cfg.run_dir)
            except RunDirLocked as err:
                refusal = str(err)
            except OSError as err:  # unwritable run_dir, or a filesystem without flock (Lustre without -o flock)
                refusal = (f"cannot lock run_dir {cfg.run_dir} ({err}); use a writable run_dir on a filesystem "
                           "with flock support (local disk, NFSv4, Lustre mounted with -o flock, GPFS)")
        refusal = broadcast_object(refusal)  # type: ignore[assignment]
        if refusal is not None:
            if info.rank == 0:
                print(f"error: {refusal}", file=sys.stderr, flush=True)
            barrier()  # leave together: torchrun stops the remaining workers as soon as one has exited
            return EXIT_RUN_DIR_LOCKED
        seed_everything(cfg.seed, cfg.deterministic)
        ckpt = ckpt_lib.resolve_resume(cfg)
        run = build(cfg, info, device)
        step, epoch = restore(run, ckpt) if ckpt is not None else (0, 0)
        if info.rank == 0:
            save_config(cfg, cfg.run_dir)
        tags = {"world_size": info.world_size, "backend": run.backend, "engine": cfg.dist.engine,
                "device": device.type, "launcher": info.launcher, "loss_backend": cfg.loss.backend,
                "bf16": run.bf16}
        tracker = make_tracker(cfg.tracking, cfg.run_dir, rank=info.rank,
                               resume_run_id=ckpt.get("mlflow_run_id") if ckpt else None, tags=tags)
        if ckpt is None:
            tracker.log_params(flatten(to_dict(cfg)))
        tracker.log_artifact(Path(cfg.run_dir) / "config.yaml")
        if info.rank == 0:
            where = f"resumed from {ckpt['path']} at step {step}" if ckpt else "starting from scratch"
            print(f"[hypersolid] {info.world_size} process(es), {cfg.dist.engine}/{run.backend}, "
                  f"device={device.type}, bf16={run.bf16}, {run.steps_per_epoch} steps/epoch, "
                  f"{run.total_steps} steps total; {where}", flush=True)
        return train_loop(run, tracker, step, epoch, resumed=ckpt is not None)
    finally:
        cleanup()
        if lock is not None:
            lock.release()
        _STOP["signal"] = None
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)


def train_loop(run: Run, tracker: Tracker, step: int, epoch: int, *, resumed: bool) -> int:
    """Epochs of train_step with logging, checkpoints, the online monitor and preemption checks.

    Host synchronisations happen only on logging steps, at epoch ends and at checkpoints (see the module
    docstring); every other step only queues work.
    """
    cfg, device, rank0 = run.cfg, run.device, run.info.rank == 0
    global_batch = cfg.data.batch_size_per_gpu * run.info.world_size
    bar = tqdm(total=run.total_steps, initial=step, disable=not (rank0 and cfg.progress), dynamic_ncols=True,
               desc="train", unit="step")
    history: list[tuple[int, float]] = []
    status, exit_code, last_saved = "FAILED", 1, (step if resumed else -1)
    monitor_enabled = cfg.eval.every_n_epochs > 0
    stop = StopVote(device)
    try:
        while step < run.total_steps and epoch < cfg.epochs:
            run.loader.set_epoch(epoch)
            run.engine.train(True)
            meter = EpochMeter(run.steps_per_epoch, device)
            preempted, t_last = False, time.perf_counter()
            for views, _labels in run.loader:
                t_data = time.perf_counter() - t_last
                views = [v.to(device, non_blocking=True) for v in views]
                stats = train_step(run, views, step)
                step += 1
                meter.add(stats, t_data)
                if step % cfg.tracking.log_every_n_steps == 0 or step == 1:
                    values = stats.to_dict()  # the logging step's one host transfer
                    run.guard.check()
                    values = {**loggable(values), **meter.window(global_batch)}
                    tracker.log_metrics({**{f"train/{k}": v for k, v in values.items()},
                                         "train/epoch": epoch, "train/mem_gb": memory_gb(device)}, step=step)
                    bar.set_postfix(loss=f"{values['loss']:.4f}", img_s=f"{values['images_per_s']:.0f}", ep=epoch)
                bar.update(1)
                if cfg.checkpoint.every_n_steps and step % cfg.checkpoint.every_n_steps == 0:
                    save(run, step, tracker)
                    last_saved = step
                if stop(_STOP["signal"] is not None):
                    preempted = True
                    break
                if step >= run.total_steps:
                    break
                t_last = time.perf_counter()
            epoch_done = run.loader.state_dict().get("batches_done", 0) >= run.steps_per_epoch
            if meter.n:
                mean, losses = meter.summary(global_batch)  # every rank: the guard must agree everywhere
                run.guard.check()
                history.extend(zip(range(step - meter.n + 1, step + 1), losses))
                loader_stats = summed_loader_stats(run)  # collective: every rank, before rank 0 logs
                if rank0:
                    bar.write(f"epoch {epoch:3d} | step {step:7d} | loss {mean['loss']:.4f} | align "
                              f"{mean['alignment']:.4f} | repel {mean['repulsion']:.4f} | active pairs "
                              f"{mean['active_pairs']:.0f} | {mean['images_per_s']:.0f} img/s | "
                              f"{time.perf_counter() - meter.t_epoch:.0f} s")
                    tracker.log_metrics({f"loader/{k}": v for k, v in loader_stats.items()}, step=step)
            if not preempted and step < run.total_steps:
                preempted = stop.now(_STOP["signal"] is not None)  # before a monitor that may take minutes
            if preempted:
                if last_saved != step:
                    save(run, step, tracker)
                if rank0:
                    bar.write(f"[hypersolid] preempted: checkpoint at step {step} written; exiting with "
                              f"{EXIT_PREEMPTED} (requeue)")
                status, exit_code = "KILLED", EXIT_PREEMPTED
                return exit_code
            if not epoch_done:  # max_steps reached mid-epoch: a last look at the representation, then stop
                if monitor_enabled:
                    log_monitor(run, tracker, bar, epoch, step)
                break
            if monitor_enabled and (epoch + 1) % cfg.eval.every_n_epochs == 0:
                monitor_enabled = log_monitor(run, tracker, bar, epoch, step)
            if cfg.checkpoint.every_n_epochs and (epoch + 1) % cfg.checkpoint.every_n_epochs == 0 \
                    and last_saved != step:
                save(run, step, tracker)
                last_saved = step
            epoch += 1
        if last_saved != step:
            save(run, step, tracker)
        if rank0 and history:
            tracker.log_artifact(plot_loss(history, Path(cfg.run_dir) / "plots" / "loss.png"))
        status, exit_code = "FINISHED", 0
        return exit_code
    finally:
        bar.close()
        tracker.close(status=status)


def parse_args(argv: list[str] | None) -> tuple[str | None, list[str]]:
    parser = argparse.ArgumentParser(
        description="Hypersolid self-supervised pre-training (run under torchrun or srun for several processes).")
    parser.add_argument("--config", default=None, help="YAML config (configs/*.yaml); defaults if omitted")
    parser.add_argument("overrides", nargs="*", help="section.key=value overrides, e.g. optim.lr=1e-3")
    args = parser.parse_args(argv)
    return args.config, args.overrides


def main(argv: list[str] | None = None) -> int:
    """Parse, validate (before any work), train. Returns the process exit code."""
    path, overrides = parse_args(argv)
    cfg = load_config(path, overrides)
    return train(cfg)


if __name__ == "__main__":
    sys.exit(main())
