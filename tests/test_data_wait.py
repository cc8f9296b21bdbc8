"""The share of the wall time a run spends waiting for its data (train/data_wait_share per logging window,
loader/data_wait_share per epoch, and the epoch line): a starved GPU shows as a high share. Per epoch, the wait for
its first batch (loader/boundary_stall_s) and the share after it (loader/steady_wait_share) are also apart."""

from __future__ import annotations

import pytest
import torch

from hypersolid_scale.losses.stats import pack
from hypersolid_scale.training import step_bookkeeping
from hypersolid_scale.training.step_bookkeeping import EpochMeter


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_meter_reports_the_share_of_time_spent_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(step_bookkeeping.time, "perf_counter", clock)
    meter = EpochMeter(steps_per_epoch=8, device=torch.device("cpu"))
    stats = pack({"loss": torch.tensor(1.0)})
    for waited in (0.3, 0.1, 0.0, 0.2):  # each step: this long waiting for the batch, 1 s in all
        clock.now += 1.0
        meter.add(stats, waited)
    window = meter.window(global_batch=16)
    assert window["data_wait_share"] == pytest.approx(0.6 / 4.0)
    assert window["images_per_s"] == pytest.approx(16.0)
    clock.now += 1.0
    meter.add(stats, 0.9)
    assert meter.window(16)["data_wait_share"] == pytest.approx(0.9)  # the next window only
    mean, _ = meter.summary(16)
    assert mean["data_wait_share"] == pytest.approx(1.5 / 5.0)  # the whole epoch
    # Apart: the wait for the epoch's first batch, and the share of the time after it spent waiting.
    assert mean["boundary_stall_s"] == pytest.approx(0.3)
    assert mean["steady_wait_share"] == pytest.approx((1.5 - 0.3) / (5.0 - 0.3))
