"""One optimizer step of any method (``train_step``), the same for every method, engine and precision: what
:mod:`hypersolid_scale.training.trainer` calls in its loop and the benchmarks time. No host synchronisation
(the trainer's docstring says why and how the statistics are read)."""

from __future__ import annotations

import torch

from hypersolid_scale.distributed import all_reduce_sum
from hypersolid_scale.losses import PackedStats
from hypersolid_scale.losses.stats import pack
from hypersolid_scale.training.accumulation import accumulated_step
from hypersolid_scale.training.run_builder import Run

__all__ = ["check_batch", "train_step"]


def train_step(run: Run, views: list[torch.Tensor], step: int) -> PackedStats:
    """One optimizer step of any method, in the order :mod:`hypersolid_scale.methods` asks for: forward (the
    engine's wrapped module holds backbone and method, and returns the method's loss over the global batch),
    backward (both in ``optim.accumulate_steps`` micro-batches when asked: ``accumulated_step``), the method's
    gradient schedule, (clip,) optimizer step, the method's post-step update (a teacher's EMA). No host sync.

    Returns the step's statistics on the device (the method's, then lr and grad_norm); read them with
    ``.to_dict()`` only where floats are needed. Per-rank statistics (each rank's loss its share of the
    global-batch loss) are averaged over ranks here: one small all-reduce, no host read. ``run.guard``
    records whether the step was finite.
    """
    lr = run.lr_setter.apply(run.engine.param_groups, step)  # a float, or a device tensor's copy (optim.lr_tensor)
    check_batch(run, views[0].shape[0], step)
    method = run.method
    if run.batch.accumulate_steps > 1:  # the same step in micro-batches (docs/design.md §3d)
        _, stats = accumulated_step(run.engine, method, run.trained, views, run.batch.accumulate_steps)
    else:
        with run.engine.autocast():
            loss, stats = run.engine.wrapped(views)
        run.engine.backward(loss)
    method.before_optimizer_step()
    grad_norm = run.engine.step()
    method.after_step(step, run.total_steps, run.backbone)
    packed = pack(stats)
    if run.info.world_size > 1 and not method.stats_reduced:
        packed = PackedStats(packed.names, all_reduce_sum(packed.values) / run.info.world_size)
    extra: dict[str, torch.Tensor | float] = {"lr": lr}
    if grad_norm is not None:
        extra["grad_norm"] = grad_norm
    packed = packed.extend(extra)
    run.guard.record(step, packed)
    return packed


def check_batch(run: Run, rows: int, step: int) -> None:
    if rows != run.batch.rank_batch:
        # The losses' all_gathers trust equal per-rank batches (no size exchange): a short batch is a bug.
        raise RuntimeError(
            f"rank {run.info.rank} got a batch of {rows} images at step {step}, expected "
            f"{run.batch.rank_batch} ({run.batch.describe()}); the training loader must yield full batches only"
        )
