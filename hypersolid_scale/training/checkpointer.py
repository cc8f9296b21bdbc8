"""When the trainer saves, and the collective save itself: ``save`` writes the run's state at a step (the
layout is ``checkpoint.collect.run_state``'s) and ``Checkpointer`` is the one decision "save now?" (docs/design.md §5).
"""

from __future__ import annotations

from hypersolid_scale import checkpoint as ckpt_lib
from hypersolid_scale.checkpoint.sharded import PendingSave, save_sharded
from hypersolid_scale.tracking import Tracker
from hypersolid_scale.training.run_builder import Run, on_every_rank

__all__ = ["Checkpointer", "save"]


def _meta(run: Run, step: int, tracker: Tracker) -> dict:
    return {
        "cfg": run.cfg,
        "loader": run.loader,
        "step": step,
        "rank": run.info.rank,
        "world_size": run.info.world_size,
        "global_batch": run.batch.global_batch,
        "mlflow_run_id": tracker.run_id,
        "tracking_uri": tracker.tracking_uri,
    }


def save(run: Run, step: int, tracker: Tracker, *, wait: bool = True) -> PendingSave | None:
    """Collective checkpoint of the run at ``step``: one file (``checkpoint.collect.run_state``'s layout), or with
    ``checkpoint.format=sharded`` a folder of parts, written in the background under ``checkpoint.async_save``
    unless ``wait`` (returned while it is written).

    Raises :class:`NonFiniteLossError` instead of saving if any step so far was not finite, and a
    ``CheckpointError`` on every rank if rank 0 cannot write the file (a full disk).
    """
    run.guard.check()  # never a checkpoint after a non-finite step
    tracker.flush()  # the metrics up to this step are durable before the checkpoint that claims them
    cfg = run.cfg.checkpoint
    if cfg.format == "sharded":
        tensors, meta = ckpt_lib.sharded_run_state(engine=run.engine, **_meta(run, step, tracker))
        pending = save_sharded(
            run.cfg.run_dir,
            step,
            tensors,
            meta,
            keep_last=cfg.keep_last,
            asynchronous=cfg.async_save and not wait,
            agree=lambda fn: on_every_rank(fn, run.info.rank),
        )
        return None if pending.future is None else pending
    state = ckpt_lib.run_state(engine=run.engine, **_meta(run, step, tracker))
    # Rank 0 writes; the agreement is also the barrier after the write.
    on_every_rank(
        lambda: state is not None and ckpt_lib.save_checkpoint(run.cfg.run_dir, state, keep_last=cfg.keep_last),
        run.info.rank,
    )
    return None


class Checkpointer:
    """The one decision "save now?": after a step (every ``checkpoint.every_n_steps``), at an epoch end
    (every ``checkpoint.every_n_epochs``) and when the run stops (finished or preempted), never twice for
    the same step. At most one save is in flight (``checkpoint.async_save``): the next one, the run's last and
    :meth:`close` wait for it."""

    def __init__(self, run: Run, tracker: Tracker, last_saved: int) -> None:
        self.run, self.tracker, self.last_saved = run, tracker, last_saved
        self.pending: PendingSave | None = None

    def due(self, step: int, *, epoch_end: int | None = None, stopping: bool = False) -> bool:
        every = self.run.cfg.checkpoint
        if step == self.last_saved:
            return False
        if stopping:
            return True
        if epoch_end is not None:
            return bool(every.every_n_epochs) and (epoch_end + 1) % every.every_n_epochs == 0
        return bool(every.every_n_steps) and step % every.every_n_steps == 0

    def __call__(self, step: int, *, epoch_end: int | None = None, stopping: bool = False) -> bool:
        """Save when due; whether it saved."""
        if not self.due(step, epoch_end=epoch_end, stopping=stopping):
            return False
        self.close()
        self.pending = save(self.run, step, self.tracker, wait=stopping)
        self.last_saved = step
        return True

    def close(self) -> None:
        """Wait for the save in flight, if any (its error, a full disk, raised here)."""
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.wait()
