"""How a run's global batch is split: over processes, then over accumulation steps (``BatchPlan``).

A config states the GLOBAL batch (``data.global_batch_size``): the images one optimizer step learns from,
whatever the number of GPUs. Each process then takes ``global / world_size`` of them per step (its rows of
every global batch, docs/design.md §3b), and with ``optim.accumulate_steps = K`` it embeds them in K
micro-batches of ``global / (world_size x K)`` images, the per-GPU batch that has to fit in memory
(docs/design.md §3d). ``data.batch_size_per_gpu`` is still accepted instead: the global batch is then
``batch_size_per_gpu x world_size x K`` and changes with the GPU count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from omegaconf import DictConfig, OmegaConf

from hypersolid_scale.data.config import DEFAULT_BATCH_SIZE_PER_GPU, DataConfig
from hypersolid_scale.safety.errors import ConfigError


@dataclass(frozen=True)
class BatchPlan:
    """``global_batch = world_size x accumulate_steps x micro_batch``."""

    global_batch: int
    world_size: int
    accumulate_steps: int
    micro_batch: int  # images per forward pass on one process: the per-GPU batch
    stated: str  # which key gave it: "data.global_batch_size" | "data.batch_size_per_gpu" | "default"

    @property
    def rank_batch(self) -> int:
        """Images one process reads per optimizer step (its K micro-batches)."""
        return self.micro_batch * self.accumulate_steps

    def describe(self) -> str:
        """The start-up line: how the global batch was split."""
        line = f"global batch {self.global_batch} = {self.world_size} process(es)"
        if self.accumulate_steps > 1:
            line += f" x {self.accumulate_steps} accumulation steps"
        line += f" x {self.micro_batch} images per GPU"
        if self.stated != "data.global_batch_size":
            line += " (data.batch_size_per_gpu: it grows with the GPU count; data.global_batch_size would not)"
        return line


def plan_batch(cfg: DataConfig, *, world_size: int, accumulate_steps: int = 1) -> BatchPlan:
    """The split of ``cfg``'s batch over ``world_size`` processes and ``accumulate_steps`` micro-batches.

    Raises ConfigError (one line) when ``data.global_batch_size`` does not divide evenly.
    """
    if world_size < 1 or accumulate_steps < 1:
        raise ConfigError(f"world size {world_size} and optim.accumulate_steps={accumulate_steps} must be >= 1")
    parts = world_size * accumulate_steps
    if cfg.global_batch_size is None:
        per_gpu = cfg.batch_size_per_gpu if cfg.batch_size_per_gpu is not None else DEFAULT_BATCH_SIZE_PER_GPU
        stated = "data.batch_size_per_gpu" if cfg.batch_size_per_gpu is not None else "default"
        return BatchPlan(per_gpu * parts, world_size, accumulate_steps, per_gpu, stated)
    total = cfg.global_batch_size
    if total % parts:
        lower, upper = total // parts * parts, (total // parts + 1) * parts
        raise ConfigError(
            f"data.global_batch_size={total} does not split over {world_size} process(es) x "
            f"{accumulate_steps} accumulation step(s) (optim.accumulate_steps): choose a multiple of {parts} "
            f"(e.g. {lower or upper} or {upper}), or another process count / optim.accumulate_steps"
        )
    return BatchPlan(total, world_size, accumulate_steps, total // parts, "data.global_batch_size")


BATCH_KEYS = ("global_batch_size", "batch_size_per_gpu")  # the two ways to state the batch


def check_batch_overrides(keys: list[str]) -> None:
    """Command-line overrides (their dotted keys) may state the batch one way only."""
    if {f"data.{k}" for k in BATCH_KEYS} <= set(keys):
        raise ConfigError(
            "the overrides set both data.global_batch_size and data.batch_size_per_gpu: state the batch one way "
            "(global_batch_size stays the same on any GPU count); drop one of them"
        )


def drop_other_batch_key(merged: DictConfig, layer: DictConfig) -> DictConfig:
    """``merged`` ready for ``layer`` (an override, a file) to be merged in: a layer that states the batch one
    way replaces the way an earlier layer stated it, so ``data.batch_size_per_gpu=64`` on a config with
    ``global_batch_size: 128`` trains 64 per GPU. (Both keys in one layer fail in ``DataConfig.validate``.)"""
    data = layer.get("data")
    if not isinstance(data, DictConfig):
        return merged
    for key, other in (BATCH_KEYS, BATCH_KEYS[::-1]):
        if key in data and other not in data and OmegaConf.select(merged, f"data.{other}") is not None:
            merged = cast(DictConfig, OmegaConf.merge(merged, {"data": {other: None}}))
    return merged
