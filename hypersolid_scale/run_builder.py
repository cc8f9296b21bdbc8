"""Everything a training run needs, built from its Config: seeds, precision, model, engine, loss, loader and
learning-rate schedule, in one plain container (``Run``).

``loss.name`` other than hypersolid trains a baseline (:mod:`hypersolid_scale.methods`): the engine then
wraps a :class:`MethodModel` (the backbone and the method's heads, teacher and state in ONE module), so
that the BatchNorm conversion and DDP cover the heads too and the checkpoint's model state holds them.

A user error met while building (data that is not where ``data.path`` says) may hit one rank only (a shard
on one node's disk): :func:`on_every_rank` makes every rank raise it together, so that none is left waiting
in a collective for a rank that has left, and rank 0 reports it once.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

import numpy as np
import torch
from torch import nn

from hypersolid_scale.config import Config
from hypersolid_scale.data import build_train_loader, in_channels
from hypersolid_scale.distributed import (Engine, WorldInfo, all_reduce_max_flag, build_engine, gather_objects,
                                          get_world_size, resolve_transport)
from hypersolid_scale.errors import ConfigError, DataError, UserError
from hypersolid_scale.losses import HypersolidLoss
from hypersolid_scale.methods import Method, build_method
from hypersolid_scale.models import build_model
from hypersolid_scale.optim import lr_schedule, optimizer_factory
from hypersolid_scale.step_monitor import NonFiniteGuard

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


def resolve_bf16(setting: str, device: torch.device) -> bool:
    if setting == "auto":
        return device.type == "cuda" and torch.cuda.is_bf16_supported()
    return setting == "true"


def on_every_rank(build_part: Callable[[], T], rank: int) -> T:
    """``build_part()`` on every rank; a UserError on any rank is raised on every rank. Collective.

    Rank 0 reports it (one line): the message itself when every rank failed alike, else each failing rank's
    message with its rank. Other exceptions (bugs) propagate unchanged.
    """
    failure: UserError | None = None
    try:
        result = build_part()
    except UserError as err:
        failure, result = err, None  # type: ignore[assignment]
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


def _train_loader(cfg: Config, info: WorldInfo, device: torch.device) -> Any:
    try:
        return build_train_loader(cfg.data, rank=info.rank, world_size=info.world_size, seed=cfg.seed,
                                  device=device)
    except (FileNotFoundError, NotADirectoryError, PermissionError) as err:
        raise DataError(f"cannot read the training data (data.path={cfg.data.path}): {err}. Fix data.path, or "
                        "prepare the data first (README, section Data)") from None


class MethodModel(nn.Module):
    """A baseline's whole trainable state: ``backbone`` (the weights evaluation reads) and ``method`` (heads,
    momentum teacher, DINO's center, SwaV's queue, the step count). ``forward(views) -> (loss, stats)``."""

    def __init__(self, backbone: nn.Module, feature_dim: int, method: Method) -> None:
        super().__init__()
        self.backbone, self.feature_dim, self.method = backbone, feature_dim, method

    def forward(self, views: list[torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return self.method(views, self.backbone)


@dataclass
class Run:
    cfg: Config
    info: WorldInfo
    device: torch.device
    engine: Engine
    loss_fn: HypersolidLoss | None  # None for a baseline: its loss is inside ``method``
    loader: Any
    lr: np.ndarray
    steps_per_epoch: int
    total_steps: int
    bf16: bool
    transport: str  # the process group's (gloo | nccl), "none" in a single process
    guard: NonFiniteGuard | None = None
    method: Method | None = None  # the baseline (loss.name != hypersolid); it lives in engine.model

    def __post_init__(self) -> None:
        if self.guard is None:
            self.guard = NonFiniteGuard(self.device, self.cfg.run_dir)

    @property
    def backbone(self) -> nn.Module:
        return self.engine.model.backbone


def _steps_per_epoch(cfg: Config, loader: Any, info: WorldInfo) -> int:
    if len(loader) < 1:
        raise ConfigError(f"the training set gives no full batch of data.batch_size_per_gpu="
                          f"{cfg.data.batch_size_per_gpu} per rank on {info.world_size} rank(s); lower the batch size")
    return len(loader)


def _method_model(cfg: Config, model: nn.Module, steps_per_epoch: int) -> MethodModel:
    """The baseline on the freshly initialised backbone (the same initial backbone as a Hypersolid run with
    this seed: ``build_model`` ran first); Hypersolid's projector is dropped."""
    if cfg.loss.name == "swav" and cfg.loss.swav.queue_length > 0 and get_world_size() > 1 \
            and cfg.dist.engine == "ddp":
        # DDP broadcasts every buffer from rank 0 before each forward, the per-rank queue included.
        raise ConfigError("loss.swav.queue_length > 0 keeps a queue per rank, which DistributedDataParallel "
                          "overwrites with rank 0's at every step; set loss.swav.queue_length=0 or run in one "
                          "process")
    method = build_method(cfg.loss, model.backbone, model.feature_dim, steps_per_epoch=steps_per_epoch)
    return MethodModel(model.backbone, model.feature_dim, method)


def _trainable_only(make: Callable[[Any], torch.optim.Optimizer]) -> Callable[[Any], torch.optim.Optimizer]:
    """The optimizer over the parameters that require grad: a baseline's teacher only follows by EMA."""
    return lambda params: make([p for p in params if p.requires_grad])


def build(cfg: Config, info: WorldInfo, device: torch.device) -> Run:
    """Model, engine (DDP | DeepSpeed) + optimizer, loss, loader and schedule. Collective under torchrun."""
    channels = in_channels(cfg.data)
    if cfg.model.in_channels != channels:
        raise ConfigError(f"model.in_channels={cfg.model.in_channels} but the data has {channels} channel(s) "
                          f"(data.dataset={cfg.data.dataset!r}); set model.in_channels={channels}")
    bf16 = resolve_bf16(cfg.dist.bf16, device)
    model = build_model(cfg.model)  # identical on every rank: the seed was set just before
    o = cfg.optim
    make_optimizer, loader, method = optimizer_factory(o), None, None
    if cfg.loss.name != "hypersolid":
        # The method's epoch schedules need the loader's length; its heads are initialised after the backbone.
        loader = on_every_rank(lambda: _train_loader(cfg, info, device), info.rank)
        model = _method_model(cfg, model, _steps_per_epoch(cfg, loader, info))
        method, make_optimizer = model.method, _trainable_only(make_optimizer)
    engine = build_engine(model, make_optimizer, engine=cfg.dist.engine, device=device, bf16=bf16,
                          grad_clip=o.grad_clip, sync_bn=cfg.dist.sync_bn, compile=cfg.dist.compile,
                          zero_stage=cfg.dist.zero_stage, batch_size_per_gpu=cfg.data.batch_size_per_gpu)
    if loader is None:
        loader = on_every_rank(lambda: _train_loader(cfg, info, device), info.rank)
    steps_per_epoch = _steps_per_epoch(cfg, loader, info)
    total = cfg.epochs * steps_per_epoch
    if cfg.max_steps > 0:
        total = min(total, cfg.max_steps)
    transport = resolve_transport(cfg.dist.transport, device) if info.world_size > 1 else "none"
    # Sync-free loss: non-finite input is caught by the guard, and every rank's batch has the same size
    # (data.batch_size_per_gpu, full batches only), so the all_gather needs no size exchange.
    loss_fn = None if method is not None else \
        HypersolidLoss.from_config(cfg.loss, check_finite=False, same_rows_per_rank=True).to(device)
    lrs = lr_schedule(o, epochs=cfg.epochs, max_steps=cfg.max_steps, steps_per_epoch=steps_per_epoch)
    return Run(cfg, info, device, engine, loss_fn, loader, lrs, steps_per_epoch, total, bf16, transport,
               method=engine.model.method if method is not None else None)
