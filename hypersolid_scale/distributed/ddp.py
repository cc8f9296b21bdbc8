"""Plain PyTorch engine: DistributedDataParallel when world size > 1, optional torch.compile, bf16 autocast."""

from __future__ import annotations

import contextlib
from typing import Any, ClassVar, cast

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from hypersolid_scale.distributed.collectives import get_world_size
from hypersolid_scale.distributed.engine import Engine, OptimizerFn, grad_norm_tensor


class DDPEngine(Engine):
    """DDP averages the gradients in backward; ``step`` clips (when ``grad_clip > 0``), steps and zeroes them."""

    kind: ClassVar[str] = "ddp"

    def __init__(
        self,
        model: nn.Module,
        optimizer_fn: OptimizerFn,
        *,
        device: torch.device,
        bf16: bool,
        grad_clip: float,
        compile: bool,
        compile_mode: str | None = None,
    ) -> None:
        self.model = model.to(device)
        self.device, self.bf16, self.grad_clip = device, bf16, grad_clip
        self.optimizer = optimizer_fn(self.model.parameters())
        wrapped: nn.Module = self.model
        self.ddp: DistributedDataParallel | None = None
        if get_world_size() > 1:
            wrapped = self.ddp = DistributedDataParallel(
                self.model, device_ids=[device.index] if device.type == "cuda" else None
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
