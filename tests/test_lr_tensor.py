"""``optim.lr_tensor``: the learning rate as a device tensor, copied from the schedule on the device at every step
(training/optim.py ``LearningRate``), gives the update of today's Python-float learning rate, bit for bit, for
each optimizer the config offers that can take it (AdamW and SGD, in torch's fused kernels); LARS and the
multi-tensor kernels are refused with a one-line reason."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from test_hot_path import TINY as HOT_PATH_TINY
from test_hot_path import host_reads
from torch import nn

import hypersolid_scale.training.trainer as train_mod
from hypersolid_scale.config.schema import load_config
from hypersolid_scale.distributed import WorldInfo
from hypersolid_scale.safety.errors import ConfigError
from hypersolid_scale.training.optim import LearningRate, OptimConfig, check, lr_schedule, optimizer_factory

STEPS = 6
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _model(device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(7, 13), nn.BatchNorm1d(13), nn.ReLU(), nn.Linear(13, 5)).to(device)


def _train(o: OptimConfig, device: torch.device, *, as_tensor: bool) -> list[torch.Tensor]:
    """STEPS optimizer steps over a warm-up + cosine schedule, the same gradients whatever the lr's type."""
    model = _model(device)
    opt = optimizer_factory(o, model)(model.parameters())
    schedule = lr_schedule(o, epochs=1, max_steps=0, steps_per_epoch=STEPS)
    assert len(np.unique(schedule)) == STEPS  # every step a different lr
    lr = LearningRate(schedule, device, as_tensor=as_tensor)
    g = torch.Generator().manual_seed(1)
    for step in range(STEPS):
        lr.apply(opt.param_groups, step)
        if as_tensor:  # every group holds the one tensor, no Python number
            assert all(group["lr"] is lr.tensor for group in opt.param_groups)
        x = torch.randn(16, 7, generator=g).to(device)
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return [p.detach().cpu().clone() for p in model.parameters()]


def _optim(name: str, **kw) -> OptimConfig:
    o = OptimConfig(name=name, lr=0.05, weight_decay=1e-2, schedule="cosine", warmup_epochs=0.5, min_lr=1e-3, **kw)
    check(o)
    return o


@pytest.mark.parametrize("name", ["adamw", "sgd"])
def test_the_tensor_lr_step_is_the_float_lr_step_bit_for_bit(name: str) -> None:
    cpu = torch.device("cpu")
    # The same (fused) kernel with a float lr: only the lr's type differs. (Today's CPU default, the multi-tensor
    # kernel, is another summation order: Adam scales its float noise on near-zero gradients up to lr-sized steps.)
    floats = _train(_optim(name, fused="true"), cpu, as_tensor=False)
    tensors = _train(_optim(name, lr_tensor=True), cpu, as_tensor=True)  # fused=auto: fused for a tensor lr
    for a, b in zip(floats, tensors):
        assert torch.equal(a, b)


def test_lars_and_the_multi_tensor_kernels_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"optim.lr_tensor.*lars.*host read"):
        _optim("lars", lr_tensor=True)
    with pytest.raises(ConfigError, match=r"optim.lr_tensor.*optim.fused=false.*optim.fused=auto"):
        _optim("adamw", lr_tensor=True, fused="false")


def test_a_resumed_optimizer_state_gets_the_tensor_back() -> None:
    """A checkpoint's optimizer state brings its own ``lr`` into the groups: the next step puts the tensor back."""
    cpu = torch.device("cpu")
    o = _optim("adamw", lr_tensor=True)
    model = _model(cpu)
    opt = optimizer_factory(o, model)(model.parameters())
    lr = LearningRate(lr_schedule(o, epochs=1, max_steps=0, steps_per_epoch=STEPS), cpu, as_tensor=True)
    lr.apply(opt.param_groups, 0)
    state = opt.state_dict()
    state["param_groups"][0]["lr"] = 0.5  # as a float-lr run saved it
    opt.load_state_dict(state)
    assert lr.apply(opt.param_groups, 3) == pytest.approx(float(lr.schedule[3]))
    assert all(group["lr"] is lr.tensor for group in opt.param_groups)
    assert lr.tensor.dtype == torch.float64 and float(lr.tensor) == lr.schedule[3]


TINY = [
    *HOT_PATH_TINY,
    "data.batch_size_per_gpu=16",
    "data.max_pretrain_samples=64",
    "dist.device=cpu",
    "optim.schedule=cosine",
    "optim.warmup_epochs=0.5",
    "optim.min_lr=1e-4",
    "optim.lr=0.01",
]  # the hot-path tests' tiny run, smaller


def _trainer_steps(tmp_path: Path, extra: list[str]) -> tuple[list[float], list[torch.Tensor]]:
    cfg = load_config(None, [*TINY, f"run_dir={tmp_path / 'run'}", *extra])
    torch.manual_seed(0)
    run = train_mod.build(cfg, WorldInfo(0, 1, 0, "single"), torch.device("cpu"))
    run.loader.set_epoch(0)
    lrs = [train_mod.train_step(run, views, i).to_dict()["lr"] for i, (views, _) in enumerate(run.loader)]
    return lrs, [p.detach().clone() for p in run.engine.model.parameters()]


def test_the_trainer_with_a_tensor_lr_trains_as_with_a_float_lr(tmp_path: Path) -> None:
    """Four trainer steps (warm-up, then cosine): the same learning rates logged and the same weights, bit for
    bit, with optim.lr_tensor=true as with the float learning rate in the same (fused) AdamW."""
    lrs0, p0 = _trainer_steps(tmp_path / "float", ["optim.fused=true"])
    lrs1, p1 = _trainer_steps(tmp_path / "tensor", ["optim.lr_tensor=true"])
    assert len(lrs0) == 4 and len(set(lrs0)) == 4 and lrs1 == lrs0
    assert all(torch.equal(a, b) for a, b in zip(p0, p1))


def test_the_tensor_lr_step_reads_nothing_on_the_host(tmp_path: Path) -> None:
    """What would make a CUDA step wait, counted on the CPU (tests/test_hot_path.py): no tensor read in the step,
    the learning rate included (copied on the device from the schedule on the device)."""
    cfg = load_config(None, [*TINY, f"run_dir={tmp_path / 'run'}", "optim.lr_tensor=true"])
    run = train_mod.build(cfg, WorldInfo(0, 1, 0, "single"), torch.device("cpu"))
    run.loader.set_epoch(0)
    reads: list = []
    with host_reads(reads):
        for i, (views, _) in enumerate(run.loader):
            train_mod.train_step(run, views, i)
    assert reads == []
    assert all(group["lr"] is run.lr_setter.tensor for group in run.engine.param_groups)


def test_a_tensor_lr_under_deepspeed_is_refused_by_the_config(tmp_path: Path) -> None:
    """A rule across sections (config/combinations.py): refused when the config loads, before anything is built."""
    with pytest.raises(ConfigError, match=r"optim.lr_tensor=true with dist.engine=deepspeed.*dist.engine=ddp"):
        load_config(None, [*TINY, f"run_dir={tmp_path / 'run'}", "optim.lr_tensor=true", "dist.engine=deepspeed"])


@cuda
@pytest.mark.cuda
@pytest.mark.parametrize("name", ["adamw", "sgd"])
def test_cuda_the_fused_tensor_lr_step_is_the_float_lr_step(name: str) -> None:
    """On CUDA the tensor is float32 (what the fused kernels compute in) and lives on the device."""
    dev = torch.device("cuda")
    floats = _train(_optim(name, fused="true"), dev, as_tensor=False)
    tensors = _train(_optim(name, lr_tensor=True), dev, as_tensor=True)
    for a, b in zip(floats, tensors):
        assert torch.equal(a, b)
