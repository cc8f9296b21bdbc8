"""Everything a training run needs, built from its Config: seeds, precision, backbone and method, engine,
loader and learning-rate schedule, in one plain container (``Run``).

Every method (``method.name``, :mod:`hypersolid_scale.methods`), Hypersolid included, trains the same way:
the engine wraps a :class:`MethodModel` (the backbone and the method's heads, loss, teacher and state in ONE
module), so that the BatchNorm conversion and DDP cover the heads too and the checkpoint's model state
holds them.

A user error met while building (data that is not where ``data.path`` says) may hit one rank only (a shard
on one node's disk): :func:`on_every_rank` makes every rank raise it together, so that none is left waiting
in a collective for a rank that has left, and rank 0 reports it once.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import numpy as np
import torch
from torch import nn

from hypersolid_scale.config.combinations import METHOD_RULES, check_combinations
from hypersolid_scale.config.schema import Config
from hypersolid_scale.data import BatchPlan, build_train_loader, in_channels, plan_batch
from hypersolid_scale.data.loading.protocol import TrainLoader
from hypersolid_scale.distributed import (
    Engine,
    WorldInfo,
    all_reduce_max_flag,
    build_engine,
    gather_objects,
    resolve_transport,
)
from hypersolid_scale.methods import Method, MethodModel, build_method_model
from hypersolid_scale.safety.errors import ConfigError, DataError, UserError
from hypersolid_scale.training.compile_scope import CompileScope, compile_scope
from hypersolid_scale.training.optim import LearningRate, lr_schedule, optimizer_factory, scaled_lr
from hypersolid_scale.training.step_bookkeeping import NonFiniteGuard

T = TypeVar("T")


def seed_everything(seed: int, deterministic: bool) -> None:
    """Same seed on every rank: the model initialises identically; the loaders derive per-rank streams."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if deterministic:
        # cuBLAS needs this before its first call to pick deterministic reductions.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False
        # warn_only: a kernel without a deterministic variant warns (once) instead of stopping a long run.
        torch.use_deterministic_algorithms(True, warn_only=True)
    else:
        torch.backends.cudnn.benchmark = True


def resolve_precision(setting: str, device: torch.device) -> str:
    """``dist.precision`` as run: bf16 | fp32 | fp64 (auto: bf16 on a CUDA device that has it, else fp32)."""
    if setting == "auto":
        return "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"
    return setting


def on_every_rank(build_part: Callable[[], T], rank: int) -> T:
    """``build_part()`` on every rank; a UserError on any rank is raised on every rank. Collective.

    Rank 0 reports it (one line): the message itself when every rank failed alike, else each failing rank's
    message with its rank. Other exceptions (bugs) propagate unchanged.
    """
    failure: UserError | None = None
    try:
        result = build_part()
    except UserError as err:
        failure, result = err, None
    messages = gather_objects(None if failure is None else str(failure))
    if not all_reduce_max_flag(failure is not None):
        return result  # type: ignore[return-value]
    text = "reported by rank 0"
    if messages is not None:  # rank 0
        failed = [(r, m) for r, m in enumerate(messages) if m is not None]
        if len(failed) == len(messages) and len({m for _, m in failed}) == 1:
            text = str(failed[0][1])
        else:
            text = "; ".join(f"on rank {r}: {m}" for r, m in failed)
    error = (type(failure) if failure is not None else UserError)(text)
    error.per_rank = False  # every rank raises it; rank 0 alone prints it
    raise error


def _train_loader(cfg: Config, info: WorldInfo, device: torch.device, batch: BatchPlan) -> TrainLoader:
    try:
        return build_train_loader(
            cfg.data,
            rank=info.rank,
            world_size=info.world_size,
            seed=cfg.seed,
            device=device,
            rank_batch=batch.rank_batch,
        )
    except (FileNotFoundError, NotADirectoryError, PermissionError) as err:
        raise DataError(
            f"cannot read the training data (data.path={cfg.data.path}): {err}. Fix data.path, or "
            "prepare the data first (README, section Data)"
        ) from None


@dataclass
class Run:
    cfg: Config
    info: WorldInfo
    device: torch.device
    engine: Engine
    loader: TrainLoader
    lr: np.ndarray
    steps_per_epoch: int
    total_steps: int
    precision: str  # bf16 (autocast over fp32 weights) | fp32 | fp64 (weights and views in float64)
    transport: str  # the process group's (gloo | nccl), "none" in a single process
    batch: BatchPlan  # the global batch's split over processes and accumulation steps
    guard: NonFiniteGuard = field(init=False)
    # The views' memory format for the step: channels-last where the model is (model.channels_last).
    memory_format: torch.memory_format = field(init=False, default=torch.contiguous_format)
    # What dist.compile compiled, and why not more (recorded in the run's parameters).
    compile_scope: CompileScope = field(default_factory=lambda: CompileScope("off"))
    # Hands lr[step] to the optimizer, as a float or a device tensor (optim.lr_tensor).
    lr_setter: LearningRate = field(init=False)

    def __post_init__(self) -> None:
        self.guard = NonFiniteGuard(self.device, self.cfg.run_dir)
        self.lr_setter = LearningRate(self.lr, self.device, as_tensor=self.cfg.optim.lr_tensor)

    @property
    def bf16(self) -> bool:
        return self.precision == "bf16"

    @property
    def dtype(self) -> torch.dtype:
        """The weights' and the views' dtype (float32 under bf16 too: autocast lowers the matmuls only)."""
        return torch.float64 if self.precision == "fp64" else torch.float32

    @property
    def trained(self) -> MethodModel:
        """The module being trained: backbone and method (the engine's unwrapped model)."""
        return cast(MethodModel, self.engine.model)

    @property
    def method(self) -> Method:
        """The method being trained (it lives in ``engine.model``)."""
        return self.trained.method

    @property
    def backbone(self) -> nn.Module:
        return self.trained.backbone


def batch_lines(run: Run) -> list[str]:
    """Rank 0's start-up lines on the batch: how it was split, and the learning rate it implies (a ``warning:``
    line when the global batch is not the one ``optim.lr`` was tuned for and ``optim.lr_scaling`` is none)."""
    lines = [f"[hypersolid] {run.batch.describe()}"]
    if (compiled := run.compile_scope.line()) is not None:
        lines.append(compiled)
    said = scaled_lr(run.cfg.optim, run.batch.global_batch)[1]
    if said is not None:
        lines.append(f"warning: {said}" if run.cfg.optim.lr_scaling == "none" else f"[hypersolid] {said}")
    return lines


def _steps_per_epoch(loader: TrainLoader, batch: BatchPlan) -> int:
    if len(loader) < 1:
        raise ConfigError(
            f"the training set gives no full global batch ({batch.describe()}); lower data.global_batch_size"
        )
    return len(loader)


def resolve_channels_last(setting: str, backbone: nn.Module, device: torch.device) -> bool:
    """``model.channels_last``: auto is on for CUDA and a convolutional backbone (more than one 2-D convolution:
    a ViT's only one is its patch embedding)."""
    if setting == "auto":
        convs = sum(isinstance(m, nn.Conv2d) for m in backbone.modules())
        return device.type == "cuda" and convs > 1
    return setting == "true"


def _trainable_only(make: Callable[[Any], torch.optim.Optimizer]) -> Callable[[Any], torch.optim.Optimizer]:
    """The optimizer over the parameters that require grad: a momentum teacher only follows by EMA."""
    return lambda params: make([p for p in params if p.requires_grad])


def build(cfg: Config, info: WorldInfo, device: torch.device) -> Run:
    """Model, engine (DDP | DeepSpeed) + optimizer, loss, loader and schedule. Collective under torchrun."""
    channels = in_channels(cfg.data)
    if cfg.model.in_channels != channels:
        raise ConfigError(
            f"model.in_channels={cfg.model.in_channels} but the data has {channels} channel(s) "
            f"(data.dataset={cfg.data.dataset!r}); set model.in_channels={channels}"
        )
    precision = resolve_precision(cfg.dist.precision, device)
    check_combinations(cfg, METHOD_RULES)  # again, for a config built without load_config (a checkpoint's)
    batch = plan_batch(cfg.data, world_size=info.world_size, accumulate_steps=cfg.optim.accumulate_steps)
    # The method's epoch schedules need the loader's length, so the loader comes first; it must not move the
    # seeded generator that initialises the weights, whatever its format does when it is built.
    with torch.random.fork_rng(devices=[]):
        loader = on_every_rank(lambda: _train_loader(cfg, info, device, batch), info.rank)
    steps_per_epoch = _steps_per_epoch(loader, batch)
    # The same initial weights on every rank: the generator was seeded just before.
    model = build_method_model(cfg.model, cfg.method, steps_per_epoch=steps_per_epoch)
    channels_last = resolve_channels_last(cfg.model.channels_last, model.backbone, device)
    if channels_last:  # the weights in NHWC before any engine or optimizer holds them; the views follow (trainer)
        model = model.to(memory_format=torch.channels_last)
    if precision == "fp64":  # every parameter and buffer (BatchNorm statistics, queues, centers); the views follow
        model = model.to(torch.float64)
    o = cfg.optim
    scope = compile_scope(cfg, info.world_size)
    if scope.scope == "backbone":  # in place: the state dict's keys and the parameter objects stay as they are
        model.backbone.compile(mode=scope.torch_mode)
    engine = build_engine(
        model,
        _trainable_only(optimizer_factory(o, model=model)),
        engine=cfg.dist.engine,
        device=device,
        bf16=precision == "bf16",
        grad_clip=o.grad_clip,
        sync_bn=cfg.dist.sync_bn,
        compile=scope.scope == "step",
        compile_mode=scope.torch_mode,
        zero_stage=cfg.dist.zero_stage,
        batch_size_per_gpu=batch.micro_batch,
        accumulate_steps=batch.accumulate_steps,
    )
    stage = loader.device_stage
    if stage is not None:  # its photometric chain compiled here, on the main thread, before any step (§3e)
        stage.prepare(batch.rank_batch, bf16=precision == "bf16")
    total = cfg.epochs * steps_per_epoch
    if cfg.max_steps > 0:
        total = min(total, cfg.max_steps)
    transport = resolve_transport(cfg.dist.transport, device) if info.world_size > 1 else "none"
    lrs = lr_schedule(
        o, epochs=cfg.epochs, max_steps=cfg.max_steps, steps_per_epoch=steps_per_epoch, global_batch=batch.global_batch
    )
    run = Run(cfg, info, device, engine, loader, lrs, steps_per_epoch, total, precision, transport, batch)
    run.memory_format = torch.channels_last if channels_last else torch.contiguous_format
    run.compile_scope = scope
    return run
