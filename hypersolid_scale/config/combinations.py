"""Checks across sections: every combination of keys the run would refuse later is refused when the config is
validated, before any process starts, with one line naming both keys and a value that works.

Each rule is one function of the whole config; :func:`check_combinations` runs them in order (``validate``
calls it after every section has checked its own keys). A rule that needs the world size reads the one the
launcher states (torchrun's or srun's variables); without a launcher it is one process.

Not here yet: ``model.in_channels`` against the data's channels (checked when the run is built,
``training/run_builder.build``), because the defaults themselves disagree (``in_channels`` 3, the built-in
Fashion-MNIST 1 channel) and many callers load the defaults for other purposes; ``model.in_channels: auto``
(the data's) would let the check move here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from hypersolid_scale.data import plan_batch
from hypersolid_scale.data.presets import resolve_preset
from hypersolid_scale.distributed.precision import check_precision
from hypersolid_scale.distributed.process_group import world_info_from_env
from hypersolid_scale.models.backbones import get_backbone
from hypersolid_scale.safety.errors import ConfigError

if TYPE_CHECKING:
    from hypersolid_scale.config.schema import Config

__all__ = ["RULES", "check_combinations"]


def check_crops_fit_backbone(cfg: Config) -> None:
    """A backbone that cuts its input into patches (the ViT) needs every view size to be whole patches."""
    multiple_of = get_backbone(cfg.model.arch).input_multiple
    if multiple_of is None:
        return
    step, key, own = multiple_of(cfg.model)
    preset = resolve_preset(cfg.data)
    sizes = {"data.global_crop_size": preset.global_crop_size}
    if preset.num_local_views > 0:
        sizes["data.local_crop_size"] = preset.local_crop_size
    bad = {k: v for k, v in sizes.items() if v % step}
    if not bad:
        return
    name, size = next(iter(bad.items()))
    common = math.gcd(*sizes.values(), *own.values())  # a patch size must divide every size and the model's own
    fits = max(d for d in range(1, step + 1) if common % d == 0)
    also = "".join(f", and {k}={v}" for k, v in own.items())
    raise ConfigError(
        f"{name}={size} is not a multiple of {key}={step} (model.arch={cfg.model.arch} cuts its input into whole "
        f"{step}x{step} patches); set {key}={fits} (it divides every crop size, {sorted(set(sizes.values()))}"
        f"{also}), or crop sizes that are multiples of {step}"
    )


def check_transport_on_device(cfg: Config) -> None:
    if cfg.dist.transport == "nccl" and cfg.dist.device == "cpu":
        raise ConfigError(
            "dist.transport=nccl needs CUDA devices, but dist.device=cpu; set dist.transport=gloo (or auto), "
            "or dist.device=cuda (or auto)"
        )


def check_engine(cfg: Config) -> None:
    """What dist.engine allows: the precision, ZeRO, the tensor learning rate, and an optimizer that needs whole
    layers."""
    check_precision(cfg.dist.precision, cfg.dist.engine)
    if cfg.dist.engine == "ddp" and cfg.dist.zero_stage != 0:
        raise ConfigError(
            f"config key 'dist.zero_stage' = {cfg.dist.zero_stage} needs dist.engine=deepspeed "
            "(DDP has no ZeRO); set dist.engine=deepspeed or dist.zero_stage=0"
        )
    if cfg.optim.lr_tensor and cfg.dist.engine != "ddp":
        raise ConfigError(
            f"optim.lr_tensor=true with dist.engine={cfg.dist.engine}: the tensor learning rate is made for torch's "
            "fused AdamW and SGD under the ddp engine; DeepSpeed wraps the optimizer in its own, which is not checked "
            "with it; set dist.engine=ddp or optim.lr_tensor=false"
        )
    if cfg.optim.name.lower() == "lars" and cfg.dist.zero_stage != 0:
        raise ConfigError(
            f"optim.name=lars cannot run under dist.zero_stage={cfg.dist.zero_stage}: ZeRO hands the optimizer "
            "flattened shards, so LARS's per-layer trust ratio would span many layers; set dist.zero_stage=0"
        )


def check_batch_splits(cfg: Config) -> None:
    """data.global_batch_size splits over the launched processes x optim.accumulate_steps (data/batch.py)."""
    plan_batch(cfg.data, world_size=world_info_from_env().world_size, accumulate_steps=cfg.optim.accumulate_steps)


RULES: tuple[Callable[[Config], None], ...] = (
    check_engine,
    check_transport_on_device,
    check_crops_fit_backbone,
    check_batch_splits,
)


def check_combinations(cfg: Config) -> None:
    """Raise the ConfigError of the first rule the config breaks."""
    for rule in RULES:
        rule(cfg)
