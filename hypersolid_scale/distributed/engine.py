"""What the trainer calls on an engine (DDP or DeepSpeed), and ``build_engine``, which picks one.

Both engines *average* gradients over ranks. The loss returns the global loss and makes each rank's
local gradient P x its share of the global gradient (docs/design.md §3), so after averaging every rank holds the
gradient a single process would compute on the concatenated batch. Nothing here rescales gradients.

Interface (:class:`Engine`): ``forward(views) -> feats (B, V, D) float32`` (float64 for a float64 model) under
``autocast()``, ``backward(loss)``, ``step() -> grad norm or None`` (clips when asked, steps, zeroes the
gradients; the norm is a 0-dim tensor: read it only when logging, on CUDA a read waits for the GPU),
``param_groups`` (for the step-indexed lr / wd schedules), ``model`` (the unwrapped ``BackboneWithProjector``),
``train(mode)``, ``load_model_state(state_dict)`` (resume weights; under DeepSpeed it also refreshes the fp32
master copy), ``optimizer_state()`` / ``load_optimizer_state(state)``.
Parameters are fp32 under every engine (fp64 when the trainer converted the model, ``dist.precision=fp64``);
bf16 means autocast in ``forward``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, ClassVar, Protocol

import torch
from torch import nn

from hypersolid_scale.distributed.batchnorm import convert_batchnorm
from hypersolid_scale.safety.errors import ConfigError

ENGINES = ("ddp", "deepspeed")
OptimizerFn = Callable[[Any], torch.optim.Optimizer]


class Engine(Protocol):
    """One training engine. The two implementations subclass it and share the methods written here.

    Attributes:
        model: the unwrapped module (its ``state_dict`` is the checkpoint's model state).
        wrapped: what the training step calls under :meth:`autocast` (the DDP wrapper, DeepSpeed's engine, or
            ``model`` itself).
        optimizer: the torch optimizer the engine was built with; its param_groups drive the schedules.
    """

    kind: ClassVar[str]
    model: nn.Module
    wrapped: nn.Module
    optimizer: torch.optim.Optimizer
    device: torch.device
    bf16: bool

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        # Under ZeRO these are still the client optimizer's groups, so lr / wd set here take effect.
        return self.optimizer.param_groups

    def autocast(self) -> contextlib.AbstractContextManager:
        """bf16 autocast on the engine's device when enabled; the parameters stay fp32 under every engine."""
        if not self.bf16:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)

    def train(self, mode: bool = True) -> None:
        self.wrapped.train(mode)

    def backward(self, loss: torch.Tensor) -> None: ...

    def micro_batch(self, last: bool) -> contextlib.AbstractContextManager:
        """Around the forward AND backward of one micro-batch of an accumulated step (docs/design.md §3d): the
        gradients are only averaged over ranks in the ``last`` one's backward. Default (one process): nothing."""
        return contextlib.nullcontext()

    def step(self) -> torch.Tensor | None: ...

    def optimizer_state(self) -> dict[str, Any] | None: ...

    def load_optimizer_state(self, state: dict[str, Any]) -> None: ...

    def load_model_state(self, state: dict[str, torch.Tensor]) -> None: ...


def grad_norm_tensor(norm: Any, device: torch.device) -> torch.Tensor | None:
    """The grad norm as a 0-dim tensor on ``device``, without a host sync (DeepSpeed reports a tensor, a float
    or None; a float is written straight into a device tensor, not copied from a host one)."""
    if norm is None:
        return None
    if isinstance(norm, torch.Tensor):
        return norm.detach().reshape(())
    return torch.full((), float(norm), device=device)


def build_engine(
    model: nn.Module,
    optimizer_fn: OptimizerFn,
    *,
    engine: str,
    device: torch.device,
    bf16: bool,
    grad_clip: float,
    sync_bn: str | bool = "auto",
    compile: bool = False,
    compile_mode: str | None = None,
    zero_stage: int = 0,
    batch_size_per_gpu: int = 1,
    accumulate_steps: int = 1,
) -> Engine:
    """``optimizer_fn(params) -> torch.optim.Optimizer`` is called once the model sits on its device.

    ``sync_bn`` (auto | true | false, see :func:`convert_batchnorm`) converts the BatchNorms here, once,
    before either engine wraps the model or builds its optimizer over the parameters. ``compile_mode``:
    torch.compile's mode under the ddp engine (None: its default; DeepSpeed compiles in its own default).
    """
    if engine not in ENGINES:
        raise ConfigError(f"unknown dist.engine {engine!r}; choose ddp or deepspeed")
    model = convert_batchnorm(model, sync_bn, device)
    # Imported here: both engine modules subclass Engine from this module.
    if engine == "ddp":
        from hypersolid_scale.distributed.ddp import DDPEngine

        return DDPEngine(
            model,
            optimizer_fn,
            device=device,
            bf16=bf16,
            grad_clip=grad_clip,
            compile=compile,
            compile_mode=compile_mode,
        )
    from hypersolid_scale.distributed.deepspeed_engine import DeepSpeedEngine

    return DeepSpeedEngine(
        model,
        optimizer_fn,
        device=device,
        bf16=bf16,
        grad_clip=grad_clip,
        zero_stage=zero_stage,
        batch_size_per_gpu=batch_size_per_gpu,
        accumulate_steps=accumulate_steps,
        compile=compile,
    )
