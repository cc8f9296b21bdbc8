"""The optimizer and its learning-rate schedule: ``OptimConfig`` (the ``optim`` config section),
``build_optimizer``, ``optimizer_factory``, ``scaled_lr``, ``lr_schedule`` and ``LearningRate`` (which hands
each step's value to the optimizer, as a Python float or as a device tensor).

Large batches: ``optim.lr`` is the learning rate at ``optim.reference_batch_size`` (the global batch it was
tuned for); ``optim.lr_scaling`` rescales it (and ``min_lr``) to the run's global batch, linearly (Goyal et
al., 2017) or by the square root (the usual rule for Adam-type optimizers). ``optim.name=lars`` is lightly's
LARS with BatchNorm parameters and biases excluded from the trust ratio and from weight decay, as in the
SimCLR and BYOL recipes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from lightly.models.utils import get_weight_decay_parameters
from lightly.utils.lars import LARS
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from hypersolid_scale.safety.errors import ConfigError

LR_SCALINGS = ("none", "linear", "sqrt")


@dataclass
class OptimConfig:
    """Optimizer and learning-rate schedule (paper: AdamW, constant lr 1e-3, weight decay 1e-6)."""

    # adamw | sgd (needs high momentum to learn with this loss: paper, "Optimizer") | lars (large-batch baselines)
    name: str = "adamw"
    lr: float = 1e-3  # for the whole global batch at reference_batch_size; see lr_scaling
    weight_decay: float = 1e-6
    momentum: float = 0.9  # SGD and LARS
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # AdamW only
    schedule: str = "constant"  # constant | cosine (cosine decays to min_lr after the warmup)
    warmup_epochs: float = 0.0  # linear warmup from 0, for both schedules
    min_lr: float = 0.0  # cosine end value
    grad_clip: float = 0.0  # max global grad norm; 0 disables clipping
    # Exact gradient accumulation (docs/design.md §3d): each process embeds its share of the global batch in
    # this many micro-batches, and the loss still sees the whole global batch at once (the same step as
    # accumulate_steps x more GPUs). The per-GPU batch becomes data.global_batch_size / (GPUs x this).
    accumulate_steps: int = 1
    reference_batch_size: int | None = None  # the global batch lr (and min_lr) were tuned for; None: unknown
    lr_scaling: str = "none"  # none | linear (lr x B / B_ref) | sqrt (lr x sqrt(B / B_ref)), B the global batch
    lars_trust_coefficient: float = 1e-3  # LARS only: lightly's trust_coefficient (eta)
    # AdamW and SGD: torch's fused kernels (true) or its multi-tensor implementation (false); auto: fused where
    # every parameter is on CUDA (torch's documentation names fused the fastest there; the GPU speed benchmark,
    # benchmarks/gpu_speed.py, measures both), multi-tensor on the CPU. The same update within float rounding.
    fused: str = "auto"
    # The learning rate as a 0-dim tensor on the parameters' device, written there from the schedule (itself on the
    # device) at every step: an optimizer step that reads no Python number, as a CUDA graph replaying the step
    # needs (issue 41). AdamW and SGD in torch's fused kernels only (optim.fused auto or true; auto then means
    # fused on the CPU too). The same update as a float learning rate, bit for bit (tests/test_lr_tensor.py).
    lr_tensor: bool = False


def _no_reference(o: OptimConfig) -> ConfigError:
    return ConfigError(
        f"config key 'optim.lr_scaling' = {o.lr_scaling!r} needs optim.reference_batch_size (the global batch "
        "optim.lr was tuned for); set optim.reference_batch_size or optim.lr_scaling=none"
    )


FUSED = ("auto", "true", "false")


def check(o: OptimConfig) -> None:
    """What the section's CHOICES and RANGES (config/schema.py) cannot see: combinations of its keys."""
    o.fused = str(o.fused).lower()  # YAML reads `true` as a bool
    if o.fused not in FUSED:
        raise ConfigError(f"config key 'optim.fused' = {o.fused!r} is not one of {FUSED}")
    if o.lr_scaling.lower() != "none" and o.reference_batch_size is None:
        raise _no_reference(o)
    if o.lr_tensor and o.name.lower() == "lars":
        raise ConfigError(
            "config key 'optim.lr_tensor' = true with optim.name=lars: lightly's LARS reads the learning rate as a "
            "Python number (p.add_(..., alpha=-lr)), a host read per parameter; set optim.lr_tensor=false or "
            "optim.name=adamw|sgd"
        )
    if o.lr_tensor and o.fused == "false":
        raise ConfigError(
            "config key 'optim.lr_tensor' = true with optim.fused=false: torch's multi-tensor AdamW refuses a tensor "
            "learning rate and its SGD reads it on the host; set optim.fused=auto (or true), or optim.lr_tensor=false"
        )
    if o.name.lower() == "lars" and o.weight_decay == 0:
        raise ConfigError(
            "config key 'optim.weight_decay' = 0 with optim.name=lars: lightly's LARS applies its trust ratio "
            "only where the weight decay is not 0, so it would be plain SGD; set optim.weight_decay > 0 "
            "(SimCLR: 1e-6, BYOL: 1.5e-6) or optim.name=sgd"
        )


def lr_factor(o: OptimConfig, global_batch: int | None) -> float:
    """What ``optim.lr_scaling`` multiplies lr and min_lr by at ``global_batch`` (1 when it is None)."""
    scaling = o.lr_scaling.lower()
    if scaling == "none" or global_batch is None:
        return 1.0
    if o.reference_batch_size is None:
        raise _no_reference(o)
    ratio = global_batch / o.reference_batch_size
    return ratio if scaling == "linear" else math.sqrt(ratio)


def scaled_lr(o: OptimConfig, global_batch: int | None) -> tuple[float, str | None]:
    """The learning rate at ``global_batch`` and one line for rank 0 to print, or None.

    The line is a warning when the global batch differs from ``optim.reference_batch_size`` and
    ``optim.lr_scaling`` is none; with linear or sqrt it says which learning rate is used.
    """
    lr = o.lr * lr_factor(o, global_batch)
    ref, scaling = o.reference_batch_size, o.lr_scaling.lower()
    if global_batch is None or ref is None or (scaling == "none" and global_batch == ref):
        return lr, None
    if scaling == "none":
        return lr, (
            f"global batch {global_batch} differs from optim.reference_batch_size={ref} that optim.lr={o.lr:g} "
            "was tuned for; the learning rate is not rescaled (optim.lr_scaling=none); set "
            "optim.lr_scaling=linear|sqrt to rescale it"
        )
    rule = f"x {global_batch}/{ref}" if scaling == "linear" else f"x sqrt({global_batch}/{ref})"
    return lr, (
        f"learning rate {lr:.4g} = optim.lr {o.lr:g} {rule} (optim.lr_scaling={scaling}, from "
        f"optim.reference_batch_size={ref} to the global batch {global_batch})"
    )


def build_optimizer(
    name: str,
    params: Any,
    *,
    lr: float,
    weight_decay: float,
    momentum: float,
    betas: tuple[float, float],
    trust_coefficient: float = 1e-3,
    fused: bool | None = None,
) -> torch.optim.Optimizer:
    """AdamW (paper default), SGD with momentum (paper: needs momentum ~0.99 to learn) or lightly's LARS.

    Groups in ``params`` keep their own ``weight_decay``; LARS skips its trust ratio where that is 0.
    ``fused``: AdamW and SGD in torch's fused kernels (None: torch's default implementation).
    """
    name = name.lower()
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=betas, fused=fused)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=weight_decay, momentum=momentum, fused=fused)
    if name == "lars":
        return LARS(params, lr=lr, weight_decay=weight_decay, momentum=momentum, trust_coefficient=trust_coefficient)
    raise ValueError(f"unknown optimizer {name!r}; choose adamw, sgd or lars")


def no_adaptation_ids(model: nn.Module) -> set[int]:
    """``id`` of every parameter LARS leaves unadapted and undecayed: those of BatchNorm layers (torch's
    ``_BatchNorm`` and any class named *BatchNorm*, such as GlobalBatchNorm) and biases.

    Ids, not names: the BatchNorm conversion, DDP and ``.to(device)`` keep the parameter objects.
    """
    norms = (_BatchNorm, *{type(m) for m in model.modules() if "BatchNorm" in type(m).__name__})
    _, excluded = get_weight_decay_parameters([model], norm_layers=norms)
    return {id(p) for p in excluded}


def lars_groups(params: Iterable[torch.Tensor], model: nn.Module) -> list[dict[str, Any]]:
    """``params`` (the engine's, all of them ``model``'s) as two parameter groups, empty ones dropped: LARS-adapted
    with the configured weight decay, and BatchNorm parameters and biases (:func:`no_adaptation_ids`) with
    weight decay 0, which lightly's LARS leaves without trust ratio: plain SGD with momentum."""
    params, own = list(params), {id(p) for p in model.parameters()}
    if foreign := [p for p in params if id(p) not in own]:
        raise ValueError(
            f"{len(foreign)} of the {len(params)} parameters given to the LARS optimizer are not those of the model "
            "passed to optimizer_factory, so their BatchNorm parameters and biases cannot be told apart"
        )
    excluded = no_adaptation_ids(model)
    groups: list[dict[str, Any]] = [
        {"params": [p for p in params if id(p) not in excluded]},
        {"params": [p for p in params if id(p) in excluded], "weight_decay": 0.0},
    ]
    return [g for g in groups if g["params"]]


def optimizer_factory(o: OptimConfig, model: nn.Module | None = None) -> Callable[[Any], torch.optim.Optimizer]:
    """``params -> optimizer`` for the engine, which decides which of ``model``'s parameters it passes.

    ``model`` is needed by LARS only (it tells BatchNorm parameters and biases apart); the engine may convert
    its BatchNorms and move it to its device first, which keeps the parameter objects.
    """
    lars = o.name.lower() == "lars"
    if lars and model is None:
        raise ValueError("optim.name=lars needs the model: optimizer_factory(o, model=model)")

    def make(params: Any) -> torch.optim.Optimizer:
        if lars and model is not None:
            params = lars_groups(params, model)
        params = list(params)
        on_cuda = all(p.is_cuda for p in params if isinstance(p, torch.Tensor))
        # A tensor learning rate needs the fused kernels wherever the parameters are (check() refused fused=false).
        fused = o.fused == "true" or (o.fused == "auto" and (on_cuda or o.lr_tensor) and bool(params))
        return build_optimizer(
            o.name,
            params,
            lr=o.lr,
            weight_decay=o.weight_decay,
            momentum=o.momentum,
            betas=(o.betas[0], o.betas[1]),
            trust_coefficient=o.lars_trust_coefficient,
            fused=True if fused and not lars else None,
        )

    return make


def lr_schedule(
    o: OptimConfig, *, epochs: int, max_steps: int, steps_per_epoch: int, global_batch: int | None = None
) -> np.ndarray:
    """Learning rate per optimizer step (DINO style: one array indexed by the global step): linear warmup
    from 0, then constant (paper) or cosine to min_lr.

    lr and min_lr are scaled to ``global_batch`` by ``optim.lr_scaling`` (:func:`scaled_lr`; None: not scaled).
    Spans the steps the run will take (``max_steps`` when it cuts the epochs short), so a cosine ends at min_lr.
    """
    factor = lr_factor(o, global_batch)
    lr, min_lr = o.lr * factor, o.min_lr * factor
    total = epochs * steps_per_epoch
    if max_steps > 0:
        total = min(total, max_steps)
    warmup = min(int(round(o.warmup_epochs * steps_per_epoch)), total)
    warm = np.linspace(0.0, lr, warmup, endpoint=False)
    rest = total - warmup
    if o.schedule.lower() == "constant":
        main = np.full(rest, lr)
    else:
        t = np.arange(rest) / max(rest, 1)
        main = min_lr + 0.5 * (lr - min_lr) * (1.0 + np.cos(math.pi * t))
    return np.concatenate([warm, main])


def lr_tensor_dtype(device: torch.device) -> torch.dtype:
    """The dtype of a tensor learning rate that gives the update of a Python float one, bit for bit: float64 on
    the CPU, where torch's optimizers multiply by the float in double precision; float32 on CUDA, where the
    fused kernels compute in float32 and round a float learning rate to it themselves."""
    return torch.float64 if device.type == "cpu" else torch.float32


class LearningRate:
    """Each step's learning rate, from the schedule (:func:`lr_schedule`), into the optimizer's param groups.

    ``as_tensor=False`` (``optim.lr_tensor=false``, the default): every group's ``lr`` is set to the step's
    Python float, as torch's optimizers are usually driven. ``as_tensor=True``: the schedule is copied to
    ``device`` once, and each step copies its value into ONE 0-dim tensor that every group holds as its
    ``lr`` (a device-to-device copy: nothing is read or sent from the host). Groups whose ``lr`` is not that
    tensor (a fresh optimizer; a resumed optimizer state, which brings its own value) get it at the next step.
    """

    def __init__(self, schedule: np.ndarray, device: torch.device, *, as_tensor: bool = False) -> None:
        self.schedule = schedule
        self.tensor: torch.Tensor | None = None
        self._values: torch.Tensor | None = None
        if as_tensor:
            dtype = lr_tensor_dtype(device)
            self._values = torch.as_tensor(schedule, dtype=dtype).to(device)
            self.tensor = torch.zeros((), dtype=dtype, device=device)

    def value(self, step: int) -> float:
        """The learning rate of optimizer step ``step`` (0-based; the last value past the schedule's end)."""
        return float(self.schedule[min(step, len(self.schedule) - 1)])  # a host array: no device involved

    def apply(self, groups: list[dict[str, Any]], step: int) -> float:
        """Set step ``step``'s learning rate in ``groups``; returns it as a float (for the step's statistics)."""
        lr = self.value(step)
        if self.tensor is None or self._values is None:
            for group in groups:
                group["lr"] = lr
            return lr
        self.tensor.copy_(self._values[min(step, len(self.schedule) - 1)])
        for group in groups:
            if group["lr"] is not self.tensor:
                group["lr"] = self.tensor
        return lr
