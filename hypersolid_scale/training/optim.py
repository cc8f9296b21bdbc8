"""The optimizer and its learning-rate schedule: ``OptimConfig`` (the ``optim`` config section),
``build_optimizer`` and ``lr_schedule``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


@dataclass
class OptimConfig:
    """Optimizer and learning-rate schedule (paper: AdamW, constant lr 1e-3, weight decay 1e-6)."""

    name: str = "adamw"  # adamw | sgd (SGD needs high momentum to learn with this loss: paper, "Optimizer")
    lr: float = 1e-3  # per the whole global batch; no linear scaling rule is applied
    weight_decay: float = 1e-6
    momentum: float = 0.9  # SGD only
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # AdamW only
    schedule: str = "constant"  # constant | cosine (cosine decays to min_lr after the warmup)
    warmup_epochs: float = 0.0  # linear warmup from 0, for both schedules
    min_lr: float = 0.0  # cosine end value
    grad_clip: float = 0.0  # max global grad norm; 0 disables clipping
    # Exact gradient accumulation (docs/design.md §3d): each process embeds its share of the global batch in
    # this many micro-batches, and the loss still sees the whole global batch at once (the same step as
    # accumulate_steps x more GPUs). The per-GPU batch becomes data.global_batch_size / (GPUs x this).
    accumulate_steps: int = 1


def build_optimizer(
    name: str, params: Any, *, lr: float, weight_decay: float, momentum: float, betas: tuple[float, float]
) -> torch.optim.Optimizer:
    """AdamW (paper default) or SGD with momentum (paper: needs momentum ~0.99 to learn)."""
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=betas)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=weight_decay, momentum=momentum)
    raise ValueError(f"unknown optimizer {name!r}; choose adamw or sgd")


def optimizer_factory(o: OptimConfig) -> Any:
    """``params -> optimizer`` for the engine, which decides which parameters (and groups) it passes."""

    def make(params: Any) -> torch.optim.Optimizer:
        return build_optimizer(
            o.name, params, lr=o.lr, weight_decay=o.weight_decay, momentum=o.momentum, betas=(o.betas[0], o.betas[1])
        )

    return make


def lr_schedule(o: OptimConfig, *, epochs: int, max_steps: int, steps_per_epoch: int) -> np.ndarray:
    """Learning rate per optimizer step (DINO style: one array indexed by the global step): linear warmup
    from 0, then constant (paper) or cosine to min_lr.

    Spans the steps the run will take (``max_steps`` when it cuts the epochs short), so a cosine ends at min_lr.
    """
    total = epochs * steps_per_epoch
    if max_steps > 0:
        total = min(total, max_steps)
    warmup = min(int(round(o.warmup_epochs * steps_per_epoch)), total)
    warm = np.linspace(0.0, o.lr, warmup, endpoint=False)
    rest = total - warmup
    if o.schedule == "constant":
        main = np.full(rest, o.lr)
    else:
        t = np.arange(rest) / max(rest, 1)
        main = o.min_lr + 0.5 * (o.lr - o.min_lr) * (1.0 + np.cos(math.pi * t))
    return np.concatenate([warm, main])
