"""When the trainer saves, and the collective save itself: ``save`` writes the run's state at a step (the
layout is ``checkpoint.collect.run_state``'s) and ``Checkpointer`` is the one decision "save now?" (docs/design.md §5).
"""

from __future__ import annotations

from hypersolid_scale import checkpoint as ckpt_lib
from hypersolid_scale.tracking import Tracker
from hypersolid_scale.training.run_builder import Run, on_every_rank

__all__ = ["Checkpointer", "save"]


def save(run: Run, step: int, tracker: Tracker) -> None:
    """Collective checkpoint of the run at ``step`` (the layout is ``checkpoint.collect.run_state``'s).

    Raises :class:`NonFiniteLossError` instead of saving if any step so far was not finite, and a
    ``CheckpointError`` on every rank if rank 0 cannot write the file (a full disk).
    """
    run.guard.check()  # never a checkpoint after a non-finite step
    tracker.flush()  # the metrics up to this step are durable before the checkpoint that claims them
    state = ckpt_lib.run_state(
        cfg=run.cfg,
        engine=run.engine,
        loader=run.loader,
        step=step,
        rank=run.info.rank,
        world_size=run.info.world_size,
        global_batch=run.batch.global_batch,
        mlflow_run_id=tracker.run_id,
        tracking_uri=tracker.tracking_uri,
    )
    keep = run.cfg.checkpoint.keep_last
    # Rank 0 writes; the agreement is also the barrier after the write.
    on_every_rank(
        lambda: state is not None and ckpt_lib.save_checkpoint(run.cfg.run_dir, state, keep_last=keep), run.info.rank
    )


class Checkpointer:
    """The one decision "save now?": after a step (every ``checkpoint.every_n_steps``), at an epoch end
    (every ``checkpoint.every_n_epochs``) and when the run stops (finished or preempted), never twice for
    the same step."""

    def __init__(self, run: Run, tracker: Tracker, last_saved: int) -> None:
        self.run, self.tracker, self.last_saved = run, tracker, last_saved

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
        save(self.run, step, self.tracker)
        self.last_saved = step
        return True
