"""The training loop's epoch-end decisions (training/epoch_end.py), in process with a stand-in run: go on, finished
(the last epoch, max_steps reached mid-epoch) or preempted; the monitor's cadence; the checkpoint it asks for; the
epoch line and the loader metrics. The full runs of tests/test_train.py, test_checkpoint.py and
test_torchrun_restart.py cover the same function inside the trainer."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from hypersolid_scale.losses import PackedStats
from hypersolid_scale.training.epoch_end import Decision, EpochEnd
from hypersolid_scale.training.step_bookkeeping import EpochMeter, NonFiniteGuard, NonFiniteLossError

CPU = torch.device("cpu")
STEPS_PER_EPOCH = 4


class Recorder:
    """A stand-in for the tracker, the progress bar, the stop vote, the checkpointer and the monitor."""

    def __init__(self, stop_now: bool = False, monitor_ok: bool = True) -> None:
        self.stop_now, self.monitor_ok = stop_now, monitor_ok
        self.lines: list[str] = []
        self.metrics: list[tuple[dict, int]] = []
        self.saves: list[tuple[int, int | None, bool]] = []
        self.monitored: list[tuple[int, int]] = []
        self.votes = 0

    def write(self, line: str) -> None:
        self.lines.append(line)

    def log_metrics(self, values: dict, step: int) -> None:
        self.metrics.append((values, step))

    def now(self, flag: bool) -> bool:
        self.votes += 1
        return self.stop_now or flag

    def checkpoint(self, step: int, *, epoch_end: int | None = None, stopping: bool = False) -> None:
        self.saves.append((step, epoch_end, stopping))

    def monitor(self, run: Any, tracker: Any, bar: Any, epoch: int, step: int) -> bool:
        self.monitored.append((epoch, step))
        return self.monitor_ok


def make(rec: Recorder, *, epochs: int = 3, total_steps: int | None = None, every: int = 1, rank: int = 0,
         batches_done: int = STEPS_PER_EPOCH, loader_stats: dict | None = None) -> EpochEnd:
    cfg = SimpleNamespace(epochs=epochs, eval=SimpleNamespace(every_n_epochs=every), run_dir="runs/x")
    loader = SimpleNamespace(state_dict=lambda: {"batches_done": batches_done}, stats=loader_stats or {})
    run = SimpleNamespace(
        cfg=cfg, info=SimpleNamespace(rank=rank), loader=loader, steps_per_epoch=STEPS_PER_EPOCH,
        total_steps=epochs * STEPS_PER_EPOCH if total_steps is None else total_steps, device=CPU,
        batch=SimpleNamespace(global_batch=8), guard=NonFiniteGuard(CPU, "runs/x"),
        method=SimpleNamespace(name="m", epoch_terms=(("loss", "loss", ".3f"),)),
    )
    return EpochEnd(run, rec, rec, rec, rec.checkpoint, monitor=rec.monitor)  # type: ignore[arg-type]


def meter(steps: int, losses: list[float] | None = None, data_s: float = 0.0) -> EpochMeter:
    m = EpochMeter(STEPS_PER_EPOCH, CPU)
    for i in range(steps):
        m.add(PackedStats(("loss",), torch.tensor([losses[i] if losses else 1.0], dtype=torch.float64)), data_s)
    return m


def test_a_full_epoch_that_is_not_the_last_continues() -> None:
    rec = Recorder()
    end = make(rec)
    assert end(0, STEPS_PER_EPOCH, meter(STEPS_PER_EPOCH), preempted=False) is Decision.CONTINUE
    assert rec.saves == [(STEPS_PER_EPOCH, 0, False)]  # an epoch-end save, not a stopping one
    assert rec.monitored == [(0, STEPS_PER_EPOCH)]
    assert rec.votes == 1  # a synchronous stop vote before the monitor


def test_the_last_epoch_finishes() -> None:
    rec = Recorder()
    end = make(rec, epochs=3)
    assert end(2, 3 * STEPS_PER_EPOCH, meter(STEPS_PER_EPOCH), preempted=False) is Decision.FINISHED
    assert rec.saves == [(3 * STEPS_PER_EPOCH, 2, True)]
    assert rec.votes == 0  # nothing left to stop


def test_max_steps_reached_mid_epoch_finishes_with_a_last_monitor() -> None:
    """max_steps=6 with 4 steps per epoch: epoch 1 stops after 2 of its batches; the monitor runs although
    its cadence (every 5 epochs) is not due, and the checkpoint is a stopping one without an epoch end."""
    rec = Recorder()
    end = make(rec, total_steps=6, every=5, batches_done=2)
    assert end(1, 6, meter(2), preempted=False) is Decision.FINISHED
    assert rec.monitored == [(1, 6)]
    assert rec.saves == [(6, None, True)]


def test_max_steps_at_an_epoch_boundary_finishes() -> None:
    rec = Recorder()
    end = make(rec, epochs=5, total_steps=2 * STEPS_PER_EPOCH, every=3)
    assert end(1, 2 * STEPS_PER_EPOCH, meter(STEPS_PER_EPOCH), preempted=False) is Decision.FINISHED
    assert rec.monitored == []  # a full epoch off the monitor's cadence
    assert rec.saves == [(2 * STEPS_PER_EPOCH, 1, True)]


@pytest.mark.parametrize("where", ["in the step loop", "at the epoch end"])
def test_preempted_saves_and_skips_the_monitor(where: str) -> None:
    rec = Recorder(stop_now=where == "at the epoch end")
    end = make(rec, batches_done=2 if where == "in the step loop" else STEPS_PER_EPOCH)
    step = 2 if where == "in the step loop" else STEPS_PER_EPOCH
    assert end(0, step, meter(step), preempted=where == "in the step loop") is Decision.PREEMPTED
    assert rec.monitored == []
    assert rec.saves == [(step, None if where == "in the step loop" else 0, True)]
    assert rec.votes == (where == "at the epoch end")  # a vote already taken is not taken again
    assert "preempted: checkpoint at step" in rec.lines[-1]


def test_preempted_on_the_last_step_is_preempted_not_finished() -> None:
    rec = Recorder()
    end = make(rec, epochs=1)
    assert end(0, STEPS_PER_EPOCH, meter(STEPS_PER_EPOCH), preempted=True) is Decision.PREEMPTED


def test_monitor_cadence_and_a_monitor_that_cannot_run_stays_off() -> None:
    rec = Recorder()
    end = make(rec, epochs=9, every=3)
    decisions = [end(e, (e + 1) * STEPS_PER_EPOCH, meter(STEPS_PER_EPOCH), preempted=False) for e in range(9)]
    assert decisions == [Decision.CONTINUE] * 8 + [Decision.FINISHED]
    assert [e for e, _ in rec.monitored] == [2, 5, 8]
    off = Recorder(monitor_ok=False)
    end = make(off, epochs=9, every=1)
    for e in range(3):
        end(e, (e + 1) * STEPS_PER_EPOCH, meter(STEPS_PER_EPOCH), preempted=False)
    assert [e for e, _ in off.monitored] == [0]  # it failed once: off for the rest of the run
    assert not make(Recorder(), every=0).monitor_enabled  # eval.every_n_epochs=0: never on


def test_epoch_line_metrics_and_history() -> None:
    rec = Recorder()
    end = make(rec, loader_stats={"corrupt_skipped": 2})
    end(0, STEPS_PER_EPOCH, meter(STEPS_PER_EPOCH, [4.0, 3.0, 2.0, 1.0]), preempted=False)
    end(1, 2 * STEPS_PER_EPOCH, meter(STEPS_PER_EPOCH, [0.5, 0.5, 0.5, 0.5]), preempted=False)
    assert end.history == [(1, 4.0), (2, 3.0), (3, 2.0), (4, 1.0), (5, 0.5), (6, 0.5), (7, 0.5), (8, 0.5)]
    line = rec.lines[0]
    assert line.startswith("epoch   0 | step       4 | loss 2.500 |") and "| data wait " in line, line
    values, step = rec.metrics[0]
    assert step == STEPS_PER_EPOCH and values["loader/corrupt_skipped"] == 2.0
    assert 0 <= values["loader/data_wait_share"] <= 1
    assert 0 <= values["loader/steady_wait_share"] <= 1 and values["loader/boundary_stall_s"] >= 0
    assert "(first batch " in line and " s, then " in line
    # Rank 1 summarises too (its guard must agree) but neither prints nor logs.
    other = Recorder()
    end = make(other, rank=1)
    end(0, STEPS_PER_EPOCH, meter(STEPS_PER_EPOCH), preempted=False)
    assert (other.lines, other.metrics, len(end.history)) == ([], [], STEPS_PER_EPOCH)


def test_an_epoch_without_steps_logs_nothing() -> None:
    """Resumed at an epoch's end: the loop meets an exhausted loader, and the block only decides."""
    rec = Recorder()
    end = make(rec, epochs=3)
    assert end(0, STEPS_PER_EPOCH, meter(0), preempted=False) is Decision.CONTINUE
    assert (rec.lines, rec.metrics, end.history) == ([], [], [])


def test_a_non_finite_epoch_raises_before_any_save() -> None:
    rec = Recorder()
    end = make(rec)
    end.run.guard.record(3, PackedStats(("loss",), torch.tensor([float("nan")], dtype=torch.float64)))
    with pytest.raises(NonFiniteLossError, match="step 3"):
        end(0, STEPS_PER_EPOCH, meter(STEPS_PER_EPOCH), preempted=False)
    assert rec.saves == []
