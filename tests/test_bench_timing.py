"""benchmarks.common.timed_loop, the one warm-up-then-timed loop of the benchmarks: which steps it runs, in
which phase, and what it reports."""

from __future__ import annotations

import os

import pytest
import torch

from benchmarks import common

CPU = torch.device("cpu")


def test_a_fixed_number_of_steps_after_the_warm_up(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(common, "sync", lambda device: calls.append(("sync", -1)))
    def step(i: int) -> int:
        calls.append(("step", i))
        return i * 10

    t = common.timed_loop(step, CPU, warmup=2, steps=3, on_start=lambda: calls.append(("start", -1)))
    assert calls == [("sync", -1), ("step", 0), ("step", 1), ("sync", -1), ("start", -1),
                     ("step", 2), ("step", 3), ("step", 4), ("sync", -1)]
    assert (t.steps, t.last) == (3, 40) and t.seconds > 0 and t.warmup_s > 0
    rates = t.rates(batch=8)
    assert rates["timed_steps"] == 3 and rates["images_per_s"] == pytest.approx(8 * 3 / t.seconds)
    assert rates["step_ms"] == pytest.approx(1000 * t.seconds / 3)


def test_a_time_bounded_loop_runs_at_least_one_and_at_most_max_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    syncs: list[int] = []
    monkeypatch.setattr(common, "sync", lambda device: syncs.append(1))
    assert common.timed_loop(lambda i: i, CPU, warmup=0, seconds=0.0, max_steps=50).steps == 1
    syncs.clear()
    t = common.timed_loop(lambda i: i, CPU, warmup=1, seconds=60.0, max_steps=9, sync_every=4)
    assert t.steps == 9 and t.last == 9  # indices go on from the warm-up's
    assert len(syncs) == 2 + 2 + 1  # around the warm-up, every 4 timed steps, at the end


def test_every_benchmark_records_the_same_facts_and_its_own_settings_after_them() -> None:
    from benchmarks import common

    meta = common.metadata("cpu", steps=3, torch_threads=7)
    assert meta["device"] == "cpu" and meta["card"] == "cpu" and meta["cpu"] == common.machine()
    assert meta["cpus"] == os.cpu_count()
    assert meta["git_commit"] == common.commit() and meta["command"].startswith("python")
    assert meta["torch"] == torch.__version__ and len(meta["load_average"]) == 3
    assert meta["steps"] == 3 and meta["torch_threads"] == 7  # the benchmark's value wins
    assert common.card("cpu") == "cpu" and common.card("cpu", cpu="x") == "x"
