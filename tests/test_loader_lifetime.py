"""A training loader lives for the run (data/loading/run_stream.py): one worker pool from the first epoch to the last, no
stall at an epoch boundary, and the same images in every batch as a loader that starts at that epoch or resumes
mid-way through it."""

from __future__ import annotations

import statistics
import threading
import time

import psutil
import pytest
import torch
from test_data_invariance import _map_style
from test_data_webdataset import PRESET, loader, make_shards

from hypersolid_scale.data.device.views import DeviceStage, HostStage


def worker_pids() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def exited(pids: set[int]) -> bool:
    alive = [psutil.Process(p) for p in pids if psutil.pid_exists(p)]
    return not psutil.wait_procs(alive, timeout=10)[1]


def test_worker_processes_are_the_same_in_every_epoch(tmp_path) -> None:
    make_shards(tmp_path, [40, 40, 40])
    before = worker_pids()  # other loaders' workers, if any are still shutting down
    ld = loader(str(tmp_path), num_workers=2)
    pids = []
    for epoch in range(3):
        ld.set_epoch(epoch)
        batches = iter(ld)
        next(batches)
        pids.append(worker_pids() - before)
        assert len(list(batches)) == len(ld) - 1
    assert len(pids[0]) == 2 and pids[0] == pids[1] == pids[2]  # epoch 1 and epoch 3: the same two workers
    assert ld._stream.opened == 1
    ld.close()
    assert exited(pids[0]), "the workers outlived close()"
    # A loader dropped without close() takes its workers with it (nothing refers back to it).
    dropped = loader(str(tmp_path), num_workers=2)
    list(dropped)
    mine = worker_pids() - before
    assert len(mine) == 2
    del dropped
    assert exited(mine), "the workers outlived their loader"


@pytest.mark.parametrize("workers", [0, 3])
def test_resume_mid_epoch_sees_exactly_the_images_of_the_uninterrupted_run(tmp_path, workers: int) -> None:
    make_shards(tmp_path, [28, 28, 28, 28])  # 7 batches of 16: epochs do not split evenly over 3 workers
    run = loader(str(tmp_path), num_workers=workers)
    assert len(run) == 7
    uninterrupted = []
    for epoch in range(3):
        run.set_epoch(epoch)
        uninterrupted.append(list(run))
    assert run._stream.opened == 1
    run.close()
    # Each epoch's batches depend on (seed, epoch) only: a loader that starts at that epoch gives the same.
    alone = loader(str(tmp_path), num_workers=workers)
    alone.set_epoch(2)
    assert [lab.tolist() for _, lab in alone] == [lab.tolist() for _, lab in uninterrupted[2]]
    alone.close()
    # A run restored at (epoch 1, 4 batches done) continues with the very same samples and views.
    resumed = loader(str(tmp_path), num_workers=workers)
    resumed.load_state_dict({"epoch": 1, "batches_done": 4})
    rest = list(resumed)
    resumed.set_epoch(2)
    rest += list(resumed)
    expected = uninterrupted[1][4:] + uninterrupted[2]
    assert [lab.tolist() for _, lab in rest] == [lab.tolist() for _, lab in expected]
    assert all(torch.equal(a, b) for (va, _), (vb, _) in zip(rest, expected) for a, b in zip(va, vb))
    assert resumed._stream.opened == 1  # the restored epoch flowed into the next one
    resumed.close()
    orders = [torch.cat([lab for _, lab in ep]).tolist() for ep in uninterrupted]
    assert orders[0] != orders[1] != orders[2]  # every epoch its own order


def test_the_wait_at_an_epoch_boundary_is_like_a_mid_epoch_wait(tmp_path) -> None:
    """Clock-driven: times measured in one run compared with a generous factor (no absolute bound).

    The consumer "trains" each batch for a step of `step_s` (a sleep, as a GPU step leaves the host's cores to
    the workers), longer than the two workers need for a batch, as in a run the loader keeps up with. A
    mid-epoch wait is then about nothing, and the wait for an epoch's first batch must be too: compared with a
    step's period (the step plus the mid-epoch wait), it is a small fraction, not the time to start workers.
    """
    make_shards(tmp_path, [20, 20, 20, 20])
    ld = loader(str(tmp_path), num_workers=2, batch_size=8)  # 10 batches an epoch
    step_s, boundary, mid = 0.06, [], []
    for epoch in range(5):
        ld.set_epoch(epoch)
        batches = iter(ld)
        for b in range(len(ld)):
            t0 = time.perf_counter()
            next(batches)
            if epoch > 0:  # epoch 0's first batch includes starting the workers: paid once a run
                (boundary if b == 0 else mid).append(time.perf_counter() - t0)
            time.sleep(step_s)
        assert next(batches, None) is None
    ld.close()
    # Medians: one hiccup of a shared machine decides nothing. Starting new workers every epoch measured
    # ~8 steps here (a loaded 2-core machine); one pool for the run 0.1-0.2.
    ratio = statistics.median(boundary) / (step_s + statistics.median(mid))
    assert ratio < 1, f"an epoch's first batch waited {ratio:.1f} steps: {boundary}, mid-epoch {mid}"


def test_map_style_loader_keeps_its_workers_and_its_batches(tmp_path) -> None:
    """The image-folder / PIL loader: the same worker pool in every epoch, the same views as a fresh or resumed one."""
    before = worker_pids()
    run = _map_style(rank=0, world=1, workers=2)  # 5 batches an epoch over 2 workers
    epochs, pids = [], []
    for epoch in range(3):
        run.set_epoch(epoch)
        batches = iter(run)
        epochs.append([next(batches)])
        pids.append(worker_pids() - before)
        epochs[-1] += list(batches)
    assert len(pids[0]) == 2 and pids[0] == pids[1] == pids[2] and run._stream.opened == 1
    run.close()
    assert exited(pids[0])
    resumed = _map_style(rank=0, world=1, workers=2)
    resumed.load_state_dict({"epoch": 1, "batches_done": 2})
    rest = list(resumed)
    resumed.set_epoch(2)
    rest += list(resumed)
    resumed.close()
    expected = epochs[1][2:] + epochs[2]
    assert len(rest) == len(expected) == 8
    for (va, la), (vb, lb) in zip(rest, expected):
        assert torch.equal(la, lb) and all(torch.equal(a, b) for a, b in zip(va, vb))


def stage_threads() -> set[int]:
    return {t.ident for t in threading.enumerate() if t.name == "device-stage" and t.ident is not None}


def test_one_stage_thread_serves_every_epoch(tmp_path) -> None:
    """data.views_on=device, the stage run ahead in a thread (as on CUDA): one thread for the run, stopped by close."""
    make_shards(tmp_path, [24, 24])
    stage = DeviceStage(PRESET, "cpu", prefetch=1)
    ld = loader(str(tmp_path), num_workers=0, batch_size=8, transform=HostStage(PRESET), device_stage=stage)
    threads = []
    for epoch in range(3):
        ld.set_epoch(epoch)
        batches = list(ld)
        assert len(batches) == len(ld) == 6 and batches[0][0][0].shape[0] == 8
        threads.append(stage_threads())
    assert len(threads[0]) == 1 and threads[0] == threads[1] == threads[2] and ld._stream.opened == 1
    ld.close()
    assert not stage_threads()
