"""DDP and DeepSpeed behind one small interface, so ``train.py`` has a single training step.

Both engines *average* gradients over ranks. The loss returns the global loss and makes each rank's
local gradient P x its share of the global gradient (docs/design.md §3), so after averaging every rank holds the
gradient a single process would compute on the concatenated batch. Nothing here rescales gradients.

Interface (both engines): ``forward(views) -> feats (B, V, D) float32``, ``backward(loss)``,
``step() -> grad norm or None`` (a 0-dim tensor: read it only when logging, on CUDA a read waits for the GPU),
``param_groups`` (for the step-indexed lr / wd schedules), ``model`` (the unwrapped ``HypersolidModel``),
``load_model_state(state_dict)`` (resume weights; under DeepSpeed it also refreshes the fp32 master copy),
``optimizer_state()`` / ``load_optimizer_state(state)``.
Parameters are fp32 under every engine; bf16 means autocast in ``forward``.

DeepSpeed checkpoints: we do not use DeepSpeed's checkpoint directories. The model weights are the full
module state (ZeRO 0-2 keep every weight on every rank), saved in the same portable file as DDP runs.
For ZeRO-1/2 the optimizer state is partitioned; each rank's partition (its base-optimizer state and its
fp32 master slice, stripped of DeepSpeed's Python objects so that ``weights_only=True`` loads it) is gathered
to rank 0 and stored as ``{"zero_stage": s, "shards": [rank0, rank1, ...]}``. Resuming the optimizer state
needs the same world size and ZeRO stage; the weights resume under any world size.
"""

from __future__ import annotations

import contextlib
import os
import socket
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from hypersolid_scale.distributed.batchnorm import convert_global_batchnorm
from hypersolid_scale.distributed.env import gather_objects


def _world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


SYNC_BN_CHOICES = ("auto", "true", "false")


def convert_batchnorm(model: nn.Module, sync_bn: str | bool, device: torch.device) -> nn.Module:
    """BatchNorm over the global batch (docs/design.md §3b) when ``sync_bn`` asks for it.

    ``auto``: whenever the world size is > 1 (with one process every BatchNorm already sees the whole batch);
    ``true``: always; ``false``: never (each rank then normalises over its own B/P images only).
    CUDA gets torch's fused ``nn.SyncBatchNorm``; any other device ``GlobalBatchNorm`` (SyncBatchNorm has no
    CPU kernel). Both keep the parameter and buffer names, so checkpoints stay interchangeable.
    """
    setting = str(sync_bn).lower()
    if setting not in SYNC_BN_CHOICES:
        raise ValueError(f"dist.sync_bn={sync_bn!r} is not allowed; choose one of: {' | '.join(SYNC_BN_CHOICES)}")
    if setting == "false" or (setting == "auto" and _world_size() == 1):
        return model
    if device.type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return convert_global_batchnorm(model)


def _norm_tensor(norm: Any, device: torch.device) -> torch.Tensor | None:
    """The grad norm as a 0-dim tensor on ``device``, without a host sync (DeepSpeed reports a tensor, a float
    or None; a float is written straight into a device tensor, not copied from a host one)."""
    if norm is None:
        return None
    if isinstance(norm, torch.Tensor):
        return norm.detach().reshape(())
    return torch.full((), float(norm), device=device)


# ----------------------------------------------------------------------------------------------------------
# DDP
# ----------------------------------------------------------------------------------------------------------


def bf16_autocast(enabled: bool, device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 autocast on ``device`` when enabled; parameters stay fp32 under every engine."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


class DDPEngine:
    """Plain PyTorch: DDP when world size > 1, optional torch.compile, bf16 autocast."""

    kind = "ddp"

    def __init__(self, model: nn.Module, optimizer_fn: Any, *, device: torch.device, bf16: bool,
                 grad_clip: float, compile: bool) -> None:
        self.model = model.to(device)
        self.device, self.bf16, self.grad_clip = device, bf16, grad_clip
        self.optimizer: torch.optim.Optimizer = optimizer_fn(self.model.parameters())
        wrapped: nn.Module = self.model
        if _world_size() > 1:
            wrapped = DistributedDataParallel(self.model, device_ids=[device.index] if device.type == "cuda" else None)
        self.wrapped = torch.compile(wrapped) if compile else wrapped

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    def autocast(self) -> contextlib.AbstractContextManager:
        return bf16_autocast(self.bf16, self.device)

    def forward(self, views: list[torch.Tensor]) -> torch.Tensor:
        with self.autocast():
            feats = self.wrapped(views)
        # The loss decides its thresholds in fp32 (docs/design.md §2), whatever the autocast dtype.
        return feats.float()

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> torch.Tensor | None:
        norm = None
        if self.grad_clip > 0:
            norm = _norm_tensor(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip), self.device)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def train(self, mode: bool = True) -> None:
        self.wrapped.train(mode)

    def optimizer_state(self) -> dict[str, Any] | None:
        return self.optimizer.state_dict()

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)

    def load_model_state(self, state: dict[str, torch.Tensor]) -> None:
        """The unwrapped model's weights; the optimizer steps the parameters themselves (no master copy)."""
        self.model.load_state_dict(state)


# ----------------------------------------------------------------------------------------------------------
# DeepSpeed
# ----------------------------------------------------------------------------------------------------------


def deepspeed_config(*, batch_size_per_gpu: int, zero_stage: int, grad_clip: float, bf16: bool = False) -> dict[str, Any]:
    """DeepSpeed's JSON config, derived from ours (one source of truth for batch and clipping).

    No "bf16" section: DeepSpeed's bf16 mode casts the module's parameters to bf16 but leaves BatchNorm's
    running statistics fp32 (BatchNorm then refuses the mixed dtypes) and hands bf16 weights to evaluation
    code that feeds fp32 images. bf16 is autocast in ``DeepSpeedEngine.forward`` instead, as under DDP:
    the parameters, gradients, master weights and optimizer state stay fp32, and the loss decides its
    thresholds in fp32 anyway (docs/design.md §2).

    But DeepSpeed's engine switches off an autocast entered outside it on CUDA unless its own
    "torch_autocast" section enables one (on an H200 the forward silently ran in fp32), so with bf16 that
    section is set, with no "lower precision safe" modules: DeepSpeed would otherwise reduce the gradients
    of every Linear and Conv in bf16, and the gradient all-reduce must stay fp32 for N processes to equal 1.
    """
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": batch_size_per_gpu,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": grad_clip,
        "zero_optimization": {"stage": zero_stage},
        # ZeRO partitions any torch optimizer's state; DeepSpeed only whitelists Adam-type ones by name,
        # and our SGD option (with momentum) would otherwise be refused.
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 2**31 - 1,  # we log ourselves
        "wall_clock_breakdown": False,
    }
    if bf16:
        config["torch_autocast"] = {"enabled": True, "dtype": "bfloat16", "lower_precision_safe_modules": []}
    return config


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _plain(obj: Any) -> Any:
    """Drop what ``torch.load(weights_only=True)`` cannot read (DeepSpeed's loss scaler, fragment maps)."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items() if _is_plain(v)}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_plain(v) for v in obj)
    # Enum members such as ZeroStageEnum subclass int/str but unpickle as their class: store the value.
    for plain in (bool, int, float, str):
        if isinstance(obj, plain):
            return plain(obj)
    return obj


def _is_plain(v: Any) -> bool:
    if isinstance(v, (torch.Tensor, int, float, bool, str, type(None))):
        return True
    if isinstance(v, (list, tuple)):
        return all(_is_plain(x) for x in v)
    if isinstance(v, dict):
        return True
    return False


class DeepSpeedEngine:
    """DeepSpeed ZeRO 0-2 with a client torch optimizer; the same loss code as DDP."""

    kind = "deepspeed"

    def __init__(self, model: nn.Module, optimizer_fn: Any, *, device: torch.device, bf16: bool, grad_clip: float,
                 zero_stage: int, batch_size_per_gpu: int, compile: bool) -> None:
        import deepspeed  # optional dependency: only DeepSpeed runs need it

        if not dist.is_initialized():
            # DeepSpeed always wants a process group; give a single process a private one.
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(_free_port()))
            os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
        self.zero_stage, self.bf16, self.device = zero_stage, bf16, device
        self.config = deepspeed_config(batch_size_per_gpu=batch_size_per_gpu, zero_stage=zero_stage,
                                       grad_clip=grad_clip, bf16=bf16)
        model = model.to(device)
        client_opt = optimizer_fn(model.parameters())
        self.engine, self.ds_optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=client_opt, config=self.config, dist_init_required=False)
        self.model: nn.Module = self.engine.module
        self.client_optimizer = client_opt
        if compile:
            self.engine.compile()

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        # ZeRO wraps the client optimizer; its param_groups are the client's, so lr / wd set here take effect.
        return self.client_optimizer.param_groups

    def autocast(self) -> contextlib.AbstractContextManager:
        # fp32 parameters + bf16 autocast, the DDP recipe (see ``deepspeed_config`` for why not DeepSpeed's bf16).
        return bf16_autocast(self.bf16, self.device)

    def forward(self, views: list[torch.Tensor]) -> torch.Tensor:
        with self.autocast():
            feats = self.engine(views)
        return feats.float()

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss)

    def step(self) -> torch.Tensor | None:
        self.engine.step()  # clips, steps and zeroes the gradients
        return _norm_tensor(self.engine.get_global_grad_norm(), self.device)

    def train(self, mode: bool = True) -> None:
        self.engine.train(mode)

    def optimizer_state(self) -> dict[str, Any] | None:
        """Collective (all ranks call it). Rank 0 gets the portable dict, other ranks None."""
        if self.zero_stage == 0 and self.ds_optimizer is self.client_optimizer:
            return self.client_optimizer.state_dict()
        shard = _plain(self.ds_optimizer.state_dict())
        shards = gather_objects(shard)
        if shards is None:
            return None
        return {"zero_stage": self.zero_stage, "shards": shards}

    def load_model_state(self, state: dict[str, torch.Tensor]) -> None:
        """Load weights into the module *and* into the optimizer's fp32 master copy.

        ZeRO 1/2 step a separate fp32 copy of the weights and copy it back into the module after every step;
        loading the module alone would be undone by the first step.
        A loaded optimizer state (``load_from_fp32_weights=True``) overwrites the master copy again with the
        checkpoint's own fp32 weights, so call this first and ``load_optimizer_state`` after it.
        """
        self.model.load_state_dict(state)
        # ZeRO's module parameters are views into its flat parameter buffers, so the load above reached them;
        # the master copy is refreshed from there. A plain torch optimizer (ZeRO 0, fp32) has no copy.
        refresh = getattr(self.ds_optimizer, "refresh_fp32_params", None)
        if refresh is not None:
            refresh()

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        if "shards" not in state:
            self.client_optimizer.load_state_dict(state)
            return
        if state["zero_stage"] != self.zero_stage or len(state["shards"]) != _world_size():
            raise ValueError(
                f"the checkpoint's optimizer state was saved with ZeRO stage {state['zero_stage']} on "
                f"{len(state['shards'])} ranks; this run uses stage {self.zero_stage} on {_world_size()} ranks. "
                "Resume with the same world size and dist.zero_stage, or pass checkpoint.resume=force to "
                "restart the optimizer state from scratch")
        self.ds_optimizer.load_state_dict(state["shards"], load_optimizer_states=True, load_from_fp32_weights=True)


Engine = DDPEngine | DeepSpeedEngine


def build_engine(model: nn.Module, optimizer_fn: Any, *, engine: str, device: torch.device, bf16: bool,
                 grad_clip: float, sync_bn: str | bool = "auto", compile: bool = False, zero_stage: int = 0,
                 batch_size_per_gpu: int = 1) -> Engine:
    """``optimizer_fn(params) -> torch.optim.Optimizer`` is called once the model sits on its device.

    ``sync_bn`` (auto | true | false, see :func:`convert_batchnorm`) converts the BatchNorms here, once,
    before either engine wraps the model or builds its optimizer over the parameters.
    """
    if engine not in ("ddp", "deepspeed"):
        raise ValueError(f"unknown dist.engine {engine!r}; choose ddp or deepspeed")
    model = convert_batchnorm(model, sync_bn, device)
    if engine == "ddp":
        return DDPEngine(model, optimizer_fn, device=device, bf16=bf16, grad_clip=grad_clip, compile=compile)
    return DeepSpeedEngine(model, optimizer_fn, device=device, bf16=bf16, grad_clip=grad_clip,
                           zero_stage=zero_stage, batch_size_per_gpu=batch_size_per_gpu, compile=compile)
