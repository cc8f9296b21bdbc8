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
from hypersolid_scale.data.augment.presets import resolve_preset
from hypersolid_scale.distributed.precision import check_precision
from hypersolid_scale.distributed.process_group import world_info_from_env
from hypersolid_scale.methods.registry import get_method
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


# ----------------------------------------------------------------------------------------------------------
# The chosen method against the other sections: from what the method says of itself (methods/base.Method)
# ----------------------------------------------------------------------------------------------------------


def check_features_have_a_head(cfg: Config) -> None:
    """eval.features other than the backbone's read the method's projection head, which some methods lack."""
    method = get_method(cfg.method.name)
    if cfg.eval.features != "backbone" and not method.projection_head:
        raise ConfigError(
            f"eval.features={cfg.eval.features!r} reads the method's projection head, which "
            f"method.name={method.name} does not have; set eval.features=backbone"
        )


def check_frozen_heads_under_zero(cfg: Config) -> None:
    """A schedule that freezes part of the head drops its gradients in the step, out of ZeRO 1/2's reach (they
    reduce the gradients into DeepSpeed's own partitioned buffers)."""
    method = get_method(cfg.method.name)
    frozen = method.frozen_by_schedule(cfg.method.section())
    if cfg.dist.engine == "deepspeed" and cfg.dist.zero_stage > 0 and frozen is not None:
        key = f"method.{method.name}.{frozen[0]}"
        raise ConfigError(
            f"method.name={method.name} with dist.engine=deepspeed and dist.zero_stage={cfg.dist.zero_stage}: "
            f"{key}={frozen[1]} freezes part of the head by dropping its gradients before the optimizer step, "
            f"which ZeRO's partitioned gradients do not allow; use dist.engine=ddp, dist.zero_stage=0, or {key}=0"
        )


def check_local_views_smaller(cfg: Config) -> None:
    """A method that tells local views from global ones by their size (lightly's multi-crop convention) needs
    local crops smaller than the global ones."""
    method = get_method(cfg.method.name)
    if not method.tells_views_by_size:
        return
    preset = resolve_preset(cfg.data)
    if preset.num_local_views > 0 and preset.local_crop_size >= preset.global_crop_size:
        raise ConfigError(
            f"method.name={method.name} tells local views from global ones by their size, but the local crops "
            f"({preset.local_crop_size} px) are not smaller than the global ones ({preset.global_crop_size} "
            "px): every view would count as global; set a smaller data.local_crop_size (e.g. 18 for 32 px "
            "CIFAR) or data.num_local_views=0"
        )


def check_per_rank_state(cfg: Config) -> None:
    """State a method keeps per rank in a buffer (SwaV's queue) is overwritten by DDP, which broadcasts every
    buffer from rank 0 before each forward, as soon as the launcher starts several processes."""
    kept = get_method(cfg.method.name).per_rank_state(cfg.method.section())
    if kept is not None and world_info_from_env().world_size > 1 and cfg.dist.engine == "ddp":
        key, what = kept
        raise ConfigError(
            f"{key} > 0 keeps {what}, which DistributedDataParallel overwrites with rank 0's at every step; "
            f"set {key}=0 or run in one process"
        )


# The chosen method's rules: run again when a run is built (training/run_builder.build), for a config that did not
# come through load_config (a checkpoint's, a test's).
METHOD_RULES: tuple[Callable[[Config], None], ...] = (
    check_features_have_a_head,
    check_frozen_heads_under_zero,
    check_local_views_smaller,
    check_per_rank_state,
)

RULES: tuple[Callable[[Config], None], ...] = (
    check_engine,
    check_transport_on_device,
    check_crops_fit_backbone,
    check_batch_splits,
    *METHOD_RULES,
)


def check_combinations(cfg: Config, rules: tuple[Callable[[Config], None], ...] = RULES) -> None:
    """Raise the ConfigError of the first rule (of ``rules``) the config breaks."""
    for rule in rules:
        rule(cfg)
