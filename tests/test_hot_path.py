"""The training hot path makes no host synchronisation outside logging steps, epoch ends and checkpoints.

On the CPU a synchronisation cannot be observed, so the CPU tests count what would cause one on CUDA: a
Python-level read of a tensor (``float(t)``, ``int(t)``, ``bool(t)``, ``t.item()``, ``t.tolist()``) made by
the trainer, the loss or the collectives. The ``cuda`` tests run steps under
``torch.cuda.set_sync_debug_mode("error")``, which raises on any synchronising CUDA call.
"""

from __future__ import annotations

import contextlib
import math
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from loss_reference import make_feats

import hypersolid_scale.training.trainer as train_mod
from hypersolid_scale.config.schema import load_config
from hypersolid_scale.distributed import WorldInfo, all_reduce_packed
from hypersolid_scale.losses import HypersolidLoss, PackedStats
from hypersolid_scale.losses.stats import HostValue, pack
from hypersolid_scale.training.optim import scaled_lr
from hypersolid_scale.training.step_bookkeeping import EpochMeter, NonFiniteGuard, NonFiniteLossError, StopVote

REPO = Path(__file__).resolve().parents[1]
PACKAGE = str(REPO / "hypersolid_scale")
TINY = ["data.dataset=digits", "model.in_channels=1", "model.small_cnn.width=4", "method.hypersolid.num_layers=2",
        "method.hypersolid.hidden_dim=32", "method.hypersolid.out_dim=32", "data.num_local_views=2", "data.batch_size_per_gpu=32",
        "data.num_workers=0", "progress=false", "eval.every_n_epochs=0", "data.max_pretrain_samples=128"]
READS = ("item", "tolist", "__float__", "__int__", "__bool__", "__index__")
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@contextlib.contextmanager
def host_reads(log: list, tag=lambda: None) -> Iterator[list]:
    """Record every Python-level tensor read made from the package's code (the data loaders excepted:
    they run between steps, on host tensors). Entries: (tag(), method, file:line)."""
    originals = {name: getattr(torch.Tensor, name) for name in READS}

    def wrap(name, fn):
        def probe(self, *args, **kwargs):
            frame = sys._getframe(1)
            where = frame.f_code.co_filename
            if where.startswith(PACKAGE) and "/data/" not in where:
                log.append((tag(), name, f"{Path(where).name}:{frame.f_lineno}"))
            return fn(self, *args, **kwargs)
        return probe

    for name, fn in originals.items():
        setattr(torch.Tensor, name, wrap(name, fn))
    try:
        yield log
    finally:
        for name, fn in originals.items():
            setattr(torch.Tensor, name, fn)


def tiny_run(tmp_path: Path, device: str, extra: list[str]) -> tuple[train_mod.Run, list]:
    cfg = load_config(None, [*TINY, f"run_dir={tmp_path / 'run'}", f"dist.device={device}", *extra])
    torch.manual_seed(0)
    run = train_mod.build(cfg, WorldInfo(0, 1, 0, "single"), torch.device(device))
    run.loader.set_epoch(0)
    batches = [[v.to(device) for v in views] for views, _ in run.loader]
    return run, batches


BACKENDS = [["method.hypersolid.backend=dense"], ["method.hypersolid.backend=tiled", "method.hypersolid.tile_size=50"],
            ["method.hypersolid.backend=neighbors", "method.hypersolid.neighbors.index=torch", "method.hypersolid.neighbors.k=8", "method.hypersolid.neighbors.recall_every=2"],
            ["method.hypersolid.backend=auto", "method.hypersolid.neighbors.k=8"], ["method.hypersolid.backend=neighbors", "method.hypersolid.neighbors.k=8"],
            ["method.hypersolid.backend=ring", "method.hypersolid.tile_size=50"],
            ["method.hypersolid.backend=dense", "optim.accumulate_steps=2"]]  # the accumulated step (docs/design.md §3d)


# ----------------------------------------------------------------------------------------------- CPU
@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: "-".join(x.split("=")[1] for x in b[:2]))
def test_train_step_reads_nothing_on_the_host(tmp_path, backend):
    run, batches = tiny_run(tmp_path, "cpu", [*backend, "optim.grad_clip=0"])
    reads: list = []
    with host_reads(reads):
        results = [train_mod.train_step(run, views, step) for step, views in enumerate(batches)]
    assert reads == []
    for stats in results:
        assert isinstance(stats, PackedStats) and stats.values.dtype == torch.float64
        assert {"loss", "lr", "nonfinite", "repulsion"} <= set(stats.names)
    # The probe does see reads: turning the statistics into floats is one.
    with host_reads(reads):
        values = results[-1].to_dict()
    assert [r[1] for r in reads] == ["tolist"] and math.isfinite(values["loss"])
    assert values["lr"] == pytest.approx(float(run.lr[len(batches) - 1]))


def test_train_loop_reads_on_logging_steps_and_epoch_ends_only(tmp_path, monkeypatch):
    """8 steps (2 epochs of 4), logging at steps 1, 3, 6: reads may follow steps 1, 3, 4, 6, 8 only."""
    phase = {"now": ("setup", 0)}
    real_step = train_mod.train_step

    def step_probe(run, views, step):
        phase["now"] = ("inside", step + 1)
        out = real_step(run, views, step)
        phase["now"] = ("after", step + 1)
        return out

    monkeypatch.setattr(train_mod, "train_step", step_probe)
    args = [*TINY, f"run_dir={tmp_path / 'run'}", "dist.device=cpu", "epochs=2", "tracking.log_every_n_steps=3",
            "checkpoint.every_n_steps=0", "checkpoint.every_n_epochs=0", "method.hypersolid.backend=auto", "method.hypersolid.neighbors.k=8"]
    reads: list = []
    with host_reads(reads, tag=lambda: phase["now"]):
        assert train_mod.main(args) == 0
    assert not [r for r in reads if r[0][0] == "inside"], reads
    after = {r[0][1] for r in reads if r[0][0] == "after"}
    assert after and after <= {1, 3, 4, 6, 8}, sorted(after)
    assert {1, 3, 6} <= after  # the logging steps did read (the probe works inside the loop)


def test_packed_stats_api():
    stats = pack({"loss": torch.tensor(2.5), "count": torch.tensor(3)})
    assert stats.names == ("loss", "count") and stats.values.dtype == torch.float64
    more = stats.extend({"lr": 0.1, "grad_norm": torch.tensor(4.0, dtype=torch.float32)})
    assert more.names == ("loss", "count", "lr", "grad_norm")
    assert more.to_dict() == pytest.approx({"loss": 2.5, "count": 3.0, "lr": 0.1, "grad_norm": 4.0})
    assert float(more["grad_norm"]) == 4.0 and "lr" in more and "x" not in more
    with pytest.raises(ValueError, match="duplicate"):
        stats.extend({"loss": 1.0})
    with pytest.raises(ValueError, match="2 names"):
        PackedStats(("a", "b"), torch.zeros(3))


def test_host_value_reads_what_was_put():
    hv = HostValue()
    assert not hv.ready
    with pytest.raises(RuntimeError, match="before put"):
        hv.get()
    t = torch.tensor([1.5, -2.0], dtype=torch.float64)
    hv.put(t)
    t += 10  # the copy was taken at put()
    np.testing.assert_array_equal(hv.get(), [1.5, -2.0])
    assert not hv.ready


def test_all_reduce_packed_without_a_process_group():
    sums, maxes = torch.tensor([1.0, 2.0]), torch.tensor([-0.5])
    s, m = all_reduce_packed(sums, maxes)
    assert torch.equal(s, sums) and torch.equal(m, maxes) and s.data_ptr() != sums.data_ptr()
    with pytest.raises(ValueError, match="1-D tensors of one dtype"):
        all_reduce_packed(sums, maxes.double())


def test_guard_remembers_the_first_non_finite_step():
    guard = NonFiniteGuard(torch.device("cpu"), "runs/x")

    def stats(loss: float, nonfinite: float = 0.0) -> PackedStats:
        return pack({"loss": torch.tensor(loss), "nonfinite": torch.tensor(nonfinite)})

    guard.record(0, stats(1.0))
    guard.record(1, stats(0.9))
    guard.check()  # all finite: nothing to say
    guard.record(2, stats(0.8, nonfinite=5.0))  # finite loss, non-finite embeddings: still a bad step
    guard.record(3, stats(float("nan")))
    guard.record(4, stats(0.7))
    with pytest.raises(NonFiniteLossError, match=r"non-finite loss at step 2 \(loss=0.8, nonfinite=5\).*runs/x"):
        guard.check()


def test_deferred_stop_vote_answers_one_step_late():
    """Deferred (several CUDA ranks), every rank acts on the previous step's vote: all stop at the same step."""
    vote = StopVote(torch.device("cpu"), deferred=True)
    assert [vote(flag) for flag in (False, True, False, False)] == [False, False, True, False]
    vote(True)
    assert vote.now(False)  # a synchronous vote at an epoch end still sees the pending one
    immediate = StopVote(torch.device("cpu"))
    assert not immediate.deferred and immediate(True) and not immediate(False)


def test_epoch_meter_means_and_losses():
    meter = EpochMeter(steps_per_epoch=4, device=torch.device("cpu"))
    for loss in (3.0, 1.0, 2.0):
        meter.add(pack({"loss": torch.tensor(loss), "lr": torch.tensor(0.5)}), data_time_s=0.25)
    window = meter.window(global_batch=8)
    assert window["data_time_s"] == 0.25 and window["images_per_s"] > 0
    assert meter.window(global_batch=8)["data_time_s"] == 0.0  # a new window starts empty
    mean, losses = meter.summary(global_batch=8)
    assert mean["loss"] == pytest.approx(2.0) and mean["lr"] == 0.5 and losses == [3.0, 1.0, 2.0]


# ----------------------------------------------------------------------------------------------- config
def test_scale_config_loads_and_states_its_launch():
    path = REPO / "configs" / "scale" / "imagenet1k_gb4096.yaml"
    cfg = load_config(path)
    header = path.read_text().split("\nrun_dir")[0]
    gpus = int(re.search(r"--nodes=(\d+)", header).group(1)) * 8  # multinode.sbatch: 8 GPUs per node
    assert 32 <= gpus <= 64 and cfg.data.global_batch_size == 4096 and 4096 % gpus == 0
    assert "sbatch" in header and "launch/slurm/multinode.sbatch" in header
    assert (REPO / "launch" / "slurm" / "multinode.sbatch").is_file()
    # 8 views: the 2 global views every preset has, plus 6 local ones; 224 and 96 px
    assert (cfg.data.num_local_views, cfg.data.global_crop_size, cfg.data.local_crop_size) == (6, 224, 96)
    assert cfg.model.arch == "resnet50" and cfg.method.hypersolid.backend == "auto" and cfg.dist.precision == "bf16"
    # the LR rule stated in the header: square-root scaling from the paper's 1e-3 at batch 512
    o = cfg.optim
    assert "sqrt" in header and (o.lr, o.reference_batch_size, o.lr_scaling) == (1e-3, 512, "sqrt")
    lr, said = scaled_lr(o, cfg.data.global_batch_size)
    assert lr == pytest.approx(1e-3 * math.sqrt(4096 / 512)) and f"{lr:.3g}" == "0.00283" and said is not None
    # the 64-GPU launch is the same command on 8 nodes: the global batch divides by 64 too
    assert "--nodes=8" in header and 4096 % 64 == 0


# ----------------------------------------------------------------------------------------------- CUDA
@contextlib.contextmanager
def sync_debug(mode: str):
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode(mode)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(0)


SYNC_FREE = [["method.hypersolid.backend=dense"], ["method.hypersolid.backend=tiled", "method.hypersolid.tile_size=50"],
             # auto's decision machinery, held on tiled (the threshold 0 is never undercut)
             ["method.hypersolid.backend=auto", "method.hypersolid.neighbors.k=8", "method.hypersolid.auto.to_neighbors=0.0"],
             ["method.hypersolid.backend=ring", "method.hypersolid.tile_size=50"],
             ["method.hypersolid.backend=tiled", "optim.accumulate_steps=2"]]  # random state capture and replay


@cuda
@pytest.mark.cuda
@pytest.mark.parametrize("backend", SYNC_FREE, ids=lambda b: b[0].split("=")[1])
def test_cuda_train_steps_never_synchronise_outside_logging(tmp_path, backend):
    run, batches = tiny_run(tmp_path, "cuda", [*backend, "dist.bf16=true"])
    train_mod.train_step(run, batches[0], 0)  # warm-up: library handles, allocator pools
    for step, views in enumerate(batches[1:], start=1):
        with sync_debug("error"):
            stats = train_mod.train_step(run, views, step)
        assert stats.values.is_cuda
        if step == 2:  # a logging step: the one transfer, outside the checked region
            assert math.isfinite(stats.to_dict()["loss"])
    run.guard.check()


@cuda
@pytest.mark.cuda
def test_cuda_loss_alone_never_synchronises():
    loss_fn = HypersolidLoss(backend="auto", k=8, check_finite=False, same_rows_per_rank=True, tile_size=64)
    feats = make_feats(64, 4, 32, regime="collapsed", seed=0, dtype=torch.float32).cuda()
    for _ in range(3):
        with sync_debug("error"):
            f = feats.clone().requires_grad_(True)
            loss_fn(f).backward()
    assert loss_fn.backend.switch.mode == "tiled" and loss_fn.stats["saturated_fraction"] == 1.0


@cuda
@pytest.mark.cuda
def test_cuda_neighbors_synchronises_once_per_step(tmp_path):
    """The neighbors backend reads one thing on the host: which rows saturated (to size the exact fallback)."""
    import warnings

    loss_fn = HypersolidLoss(backend="neighbors", k=8, check_finite=False, same_rows_per_rank=True)
    feats = make_feats(64, 4, 32, regime="spread", seed=0, dtype=torch.float32).cuda()
    loss_fn(feats.clone().requires_grad_(True)).backward()
    with warnings.catch_warnings(record=True) as caught, sync_debug("warn"):
        warnings.simplefilter("always")
        f = feats.clone().requires_grad_(True)
        loss_fn(f).backward()
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    assert len(syncs) <= 1, [str(w.message) for w in syncs]
