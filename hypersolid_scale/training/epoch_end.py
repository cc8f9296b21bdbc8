"""What the training loop does when an epoch's step loop ends, and what it decides: go on, stop because the
run is finished, or stop because it was preempted (docs/design.md §5).

At an epoch's end (a full pass over the loader, ``max_steps`` reached mid-epoch, or a preemption vote that
broke the step loop) :class:`EpochEnd` summarises the epoch (the epoch line, the loader's counters over all
ranks, the non-finite check), takes a synchronous stop vote before anything slow, runs the online monitor
on its cadence (every ``eval.every_n_epochs`` epochs, and once more when the run stops mid-epoch), saves
a checkpoint when one is due and returns its :class:`Decision`. Every rank calls it and takes the same
decision: the collectives inside (loader counters, stop vote, monitor, checkpoint) meet on every rank.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm import tqdm

from hypersolid_scale.safety.preemption import EXIT_PREEMPTED, stop_requested
from hypersolid_scale.tracking import Tracker
from hypersolid_scale.training.checkpointer import Checkpointer
from hypersolid_scale.training.epoch_records import EPOCHS_FILE, record_epoch
from hypersolid_scale.training.epoch_report import log_monitor, summed_loader_stats
from hypersolid_scale.training.run_builder import Run
from hypersolid_scale.training.step_bookkeeping import EpochMeter, StopVote

if TYPE_CHECKING:
    from hypersolid_scale.methods.base import Method

__all__ = ["Decision", "EpochEnd"]

# (run, tracker, bar, epoch, step) -> False when the monitor cannot run on this data (it then stays off).
Monitor = Callable[[Run, Tracker, tqdm, int, int], bool]


def epoch_terms(method: Method, mean: dict[str, float]) -> str:
    """The epoch line's loss terms: the method's ``epoch_terms`` from the epoch's mean statistics."""
    terms = method.epoch_terms or ((f"{method.name} loss", "loss", ".4f"),)
    return " | ".join(f"{label} {mean[key]:{fmt}}" for label, key, fmt in terms)


class Decision(enum.Enum):
    CONTINUE = "continue"  # the next epoch
    FINISHED = "finished"  # the last epoch done, or max_steps reached: exit 0
    PREEMPTED = "preempted"  # a stop signal on some rank: the checkpoint is written, exit 75 (requeue)


@dataclass
class EpochEnd:
    """The epoch-end block of the training loop, called once per epoch with that epoch's step count, meter
    and whether the step loop stopped on a preemption vote. It keeps what lasts across epochs: the loss
    history (``(step, loss)`` pairs, the loss plot's) and whether the monitor is still on."""

    run: Run
    tracker: Tracker
    bar: tqdm
    stop: StopVote
    checkpoint: Checkpointer
    monitor: Monitor = log_monitor
    history: list[tuple[int, float]] = field(default_factory=list)
    monitor_enabled: bool = field(init=False)

    def __post_init__(self) -> None:
        self.monitor_enabled = self.run.cfg.eval.every_n_epochs > 0

    def __call__(self, epoch: int, step: int, meter: EpochMeter, *, preempted: bool) -> Decision:
        run, cfg, rank0 = self.run, self.run.cfg, self.run.info.rank == 0
        epoch_done = run.loader.state_dict().get("batches_done", 0) >= run.steps_per_epoch
        if meter.n:
            self._summary(epoch, step, meter, rank0)
        if not preempted and step < run.total_steps:
            preempted = self.stop.now(stop_requested())  # before a monitor that may take minutes
        # max_steps reached mid-epoch, or the last epoch done: a last look at the representation, then stop.
        finished = not epoch_done or step >= run.total_steps or epoch + 1 >= cfg.epochs
        every = cfg.eval.every_n_epochs
        if self.monitor_enabled and not preempted and (not epoch_done or (epoch + 1) % every == 0):
            self.monitor_enabled = self.monitor(run, self.tracker, self.bar, epoch, step) or not epoch_done
        self.checkpoint(step, epoch_end=epoch if epoch_done else None, stopping=preempted or finished)
        if preempted:
            if rank0:
                self.bar.write(
                    f"[hypersolid] preempted: checkpoint at step {step} written; exiting with "
                    f"{EXIT_PREEMPTED} (requeue)"
                )
            return Decision.PREEMPTED
        return Decision.FINISHED if finished else Decision.CONTINUE

    def record_part(self, epoch: int, step: int, meter: EpochMeter) -> None:
        """After a checkpoint mid-epoch, rank 0 records the epoch so far in epochs.jsonl: a kill before the
        epoch's end then loses no statistic of a step that the resumed run does not repeat (read_epochs
        combines this part with the resumed run's; the epoch-end record, covering it, replaces it)."""
        if self.run.info.rank == 0 and meter.n:
            mean, _ = meter.summary(self.run.batch.global_batch)  # one host transfer, beside the checkpoint's
            record_epoch(Path(self.run.cfg.run_dir) / EPOCHS_FILE, epoch, step, meter.n, mean)

    def _summary(self, epoch: int, step: int, meter: EpochMeter, rank0: bool) -> None:
        """The epoch's summary on every rank (the guard must agree everywhere), logged by rank 0."""
        run = self.run
        mean, losses = meter.summary(run.batch.global_batch)
        run.guard.check()
        self.history.extend(zip(range(step - meter.n + 1, step + 1), losses))
        loader_stats = summed_loader_stats(run)  # collective: every rank, before rank 0 logs
        if rank0:
            self.bar.write(
                f"epoch {epoch:3d} | step {step:7d} | {epoch_terms(run.method, mean)} | "
                f"{mean['images_per_s']:.0f} img/s | data wait {mean['data_wait_share']:.0%} "
                f"(first batch {mean['boundary_stall_s']:.2f} s, then {mean['steady_wait_share']:.0%}) | "
                f"{time.perf_counter() - meter.t_epoch:.0f} s"
            )
            waited = {  # the epoch's share waiting for data; the wait for its first batch; the share after it
                "loader/data_wait_share": mean["data_wait_share"],
                "loader/boundary_stall_s": mean["boundary_stall_s"],
                "loader/steady_wait_share": mean["steady_wait_share"],
            }
            record_epoch(Path(run.cfg.run_dir) / EPOCHS_FILE, epoch, step, meter.n, mean)
            self.tracker.log_metrics({**{f"loader/{k}": v for k, v in loader_stats.items()}, **waited}, step=step)
