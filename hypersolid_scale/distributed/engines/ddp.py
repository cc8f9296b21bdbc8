"""Plain PyTorch engine: DistributedDataParallel when world size > 1, optional torch.compile, bf16 autocast."""

from __future__ import annotations

import contextlib
from typing import Any, ClassVar, cast

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from hypersolid_scale.distributed.collectives import get_world_size
from hypersolid_scale.distributed.engines import Engine, EngineOptions, OptimizerFn, grad_norm_tensor, register_engine


def keep_first_buckets(world_size: int) -> bool:
    """Whether DDP keeps the gradient buckets it starts with (``find_unused_parameters=True``), for resumes that
    are bit-identical on more than two ranks.

    DDP re-buckets the gradients after its first step, in the order they became ready; and over three or more
    ranks the all-reduce's order of summation of an element depends on where it sits in its bucket (over two,
    a + b = b + a). A resumed run's first step would then sum in the starting layout where the uninterrupted run
    sums in the rebuilt one: 4 ranks, 1.5e-8 apart in float32 two steps on (docs/design.md §5). The reducer rebuilds
    only when ``find_unused_parameters`` is off (torch's ``Reducer::should_rebuild_buckets``): the one public
    switch, at the price of one walk of the autograd graph per step and torch's one-time warning that no unused
    parameter was found. Two ranks resume bit-identically either way, and keep DDP's default."""
    return world_size > 2


@register_engine
class DDPEngine(Engine):
    """DDP averages the gradients in backward; ``step`` clips (when ``grad_clip > 0``), steps and zeroes them."""

    kind: ClassVar[str] = "ddp"
    order: ClassVar[int] = 0  # the default

    def __init__(self, model: nn.Module, optimizer_fn: OptimizerFn, options: EngineOptions) -> None:
        """Around ``model`` (its BatchNorms already converted); of ``options``: device, bf16, grad_clip,
        compile, compile_mode."""
        device, bf16, grad_clip = options.device, options.bf16, options.grad_clip
        compile, compile_mode = options.compile, options.compile_mode
        self.model = model.to(device)
        self.device, self.bf16, self.grad_clip = device, bf16, grad_clip
        self.optimizer = optimizer_fn(self.model.parameters())
        wrapped: nn.Module = self.model
        self.ddp: DistributedDataParallel | None = None
        if (world_size := get_world_size()) > 1:
            wrapped = self.ddp = DistributedDataParallel(
                self.model,
                device_ids=[device.index] if device.type == "cuda" else None,
                find_unused_parameters=keep_first_buckets(world_size),
            )
        # An OptimizedModule; compile_mode: torch.compile's (None: its default; reduce-overhead: CUDA graphs).
        self.wrapped = cast(nn.Module, torch.compile(wrapped, mode=compile_mode)) if compile else wrapped

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def micro_batch(self, last: bool) -> contextlib.AbstractContextManager:
        # DDP decides in forward whether the coming backward all-reduces: no_sync must cover both.
        if self.ddp is None or last:
            return contextlib.nullcontext()
        return self.ddp.no_sync()

    def step(self) -> torch.Tensor | None:
        norm = None
        if self.grad_clip > 0:
            norm = grad_norm_tensor(
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip), self.device
            )
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def optimizer_state(self) -> dict[str, Any] | None:
        return self.optimizer.state_dict()

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)

    def load_model_state(self, state: dict[str, torch.Tensor]) -> None:
        """The unwrapped model's weights; the optimizer steps the parameters themselves (no master copy)."""
        self.model.load_state_dict(state)
