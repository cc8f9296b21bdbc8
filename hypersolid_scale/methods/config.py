"""Typed configuration of the self-supervised method: which objective trains the backbone, and its hyperparameters.

``name`` picks the method; each baseline has its own section (``loss.simclr.*``, ``loss.vicreg.*``, ...), read
only when it is the chosen one. ``hypersolid`` is configured by the existing ``loss.*`` keys
(:class:`~hypersolid_scale.losses.LossConfig`) and the ``model.proj_*`` projector keys, not here.

Every default names its source: the method's paper, lightly's defaults (the library that provides the heads
and losses) or solo-learn's configs. Head widths default to the papers' ImageNet values; small-data runs
usually shrink them (e.g. solo-learn's CIFAR configs use 2048-wide VICReg/Barlow Twins projectors).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from hypersolid_scale.data.presets import resolve_preset
from hypersolid_scale.errors import ConfigError
from hypersolid_scale.losses.config import LossConfig

METHODS: tuple[str, ...] = ("hypersolid", "simclr", "vicreg", "barlowtwins", "byol", "dino", "swav")

# Field kinds checked by `_check_section`: what each accepts, as the error message states it.
_KINDS = {
    "pos_int": "a positive integer",
    "layers": "an integer >= 2",
    "nonneg_int": "an integer >= 0",
    "pos_float": "a number > 0",
    "nonneg_float": "a number >= 0",
    "unit": "a number in [0, 1]",
    "bool": "true or false",
}


@dataclass
class SimCLRConfig:
    hidden_dim: int = 2048  # SimCLR paper (v1): projection MLP as wide as ResNet-50's features; lightly default
    out_dim: int = 128  # SimCLR paper, lightly default
    num_layers: int = 2  # SimCLR v1 (2 Linear layers); v2 uses 3
    temperature: float = 0.5  # SimCLR paper's CIFAR-10 setting, lightly default (its ImageNet runs use 0.1)

    KINDS = {"hidden_dim": "pos_int", "out_dim": "pos_int", "num_layers": "layers", "temperature": "pos_float"}


@dataclass
class VICRegConfig:
    hidden_dim: int = 8192  # VICReg paper: 3 Linear layers of 8192 units; lightly default
    out_dim: int = 8192  # VICReg paper
    num_layers: int = 3  # VICReg paper
    sim_coeff: float = 25.0  # VICReg paper lambda (invariance); lightly lambda_param
    std_coeff: float = 25.0  # VICReg paper mu (variance); lightly mu_param
    cov_coeff: float = 1.0  # VICReg paper nu (covariance); lightly nu_param
    eps: float = 1e-4  # VICReg paper epsilon inside the standard deviation; lightly default

    KINDS = {"hidden_dim": "pos_int", "out_dim": "pos_int", "num_layers": "layers", "sim_coeff": "nonneg_float",
             "std_coeff": "nonneg_float", "cov_coeff": "nonneg_float", "eps": "pos_float"}


@dataclass
class BarlowTwinsConfig:
    hidden_dim: int = 8192  # Barlow Twins paper: 3 Linear layers of 8192 units; lightly default
    out_dim: int = 8192  # Barlow Twins paper
    lambda_param: float = 0.005  # Barlow Twins paper lambda (off-diagonal weight); lightly default

    KINDS = {"hidden_dim": "pos_int", "out_dim": "pos_int", "lambda_param": "nonneg_float"}


@dataclass
class BYOLConfig:
    hidden_dim: int = 4096  # BYOL paper: projector and predictor hidden width; lightly default
    out_dim: int = 256  # BYOL paper
    momentum_base: float = 0.996  # BYOL paper tau_base (solo-learn's CIFAR configs use 0.99)
    momentum_end: float = 1.0  # BYOL paper: tau follows a cosine from tau_base to 1 over training

    KINDS = {"hidden_dim": "pos_int", "out_dim": "pos_int", "momentum_base": "unit", "momentum_end": "unit"}


@dataclass
class DINOConfig:
    hidden_dim: int = 2048  # DINO paper: 3-layer MLP of width 2048; lightly default
    bottleneck_dim: int = 256  # DINO paper; lightly default
    out_dim: int = 65536  # DINO paper K; lightly default (solo-learn's CIFAR configs use 4096)
    batch_norm: bool = False  # DINO paper: no BN in the head (lightly default)
    norm_last_layer: bool = True  # DINO paper: weight-normalised last layer with fixed norm; lightly default
    freeze_last_layer_epochs: int = 1  # DINO paper: last layer frozen during the first epoch
    warmup_teacher_temp: float = 0.04  # DINO paper; lightly default
    teacher_temp: float = 0.04  # DINO paper (0.07 for long runs); lightly default
    warmup_teacher_temp_epochs: int = 30  # DINO paper; lightly default
    student_temp: float = 0.1  # DINO paper; lightly default
    center_momentum: float = 0.9  # DINO paper m; lightly default
    momentum_base: float = 0.996  # DINO paper: teacher EMA from 0.996 to 1 with a cosine schedule
    momentum_end: float = 1.0  # DINO paper

    KINDS = {"hidden_dim": "pos_int", "bottleneck_dim": "pos_int", "out_dim": "pos_int", "batch_norm": "bool",
             "norm_last_layer": "bool", "freeze_last_layer_epochs": "nonneg_int", "warmup_teacher_temp": "pos_float",
             "teacher_temp": "pos_float", "warmup_teacher_temp_epochs": "nonneg_int", "student_temp": "pos_float",
             "center_momentum": "unit", "momentum_base": "unit", "momentum_end": "unit"}


@dataclass
class SwaVConfig:
    hidden_dim: int = 2048  # SwaV paper: 2-layer MLP of width 2048; lightly default
    out_dim: int = 128  # SwaV paper; lightly default
    n_prototypes: int = 3000  # SwaV paper (ImageNet); lightly default
    temperature: float = 0.1  # SwaV paper tau; lightly default
    sinkhorn_iterations: int = 3  # SwaV paper; lightly default
    sinkhorn_epsilon: float = 0.05  # SwaV paper epsilon; lightly default
    freeze_prototypes_steps: int = 313  # SwaV paper: prototypes frozen during the first epoch (313 iterations)
    queue_length: int = 0  # lightly default (off); SwaV paper: 3840 for batches of 256, split across ranks
    queue_start_epoch: int = 15  # SwaV paper: the queue joins the assignment from epoch 15

    KINDS = {"hidden_dim": "pos_int", "out_dim": "pos_int", "n_prototypes": "pos_int", "temperature": "pos_float",
             "sinkhorn_iterations": "pos_int", "sinkhorn_epsilon": "pos_float",
             "freeze_prototypes_steps": "nonneg_int", "queue_length": "nonneg_int", "queue_start_epoch": "nonneg_int"}


@dataclass
class MethodConfig:
    """The method (``loss.name``) and every baseline's hyperparameters (``loss.<name>.<key>``)."""

    name: str = "hypersolid"
    simclr: SimCLRConfig = field(default_factory=SimCLRConfig)
    vicreg: VICRegConfig = field(default_factory=VICRegConfig)
    barlowtwins: BarlowTwinsConfig = field(default_factory=BarlowTwinsConfig)
    byol: BYOLConfig = field(default_factory=BYOLConfig)
    dino: DINOConfig = field(default_factory=DINOConfig)
    swav: SwaVConfig = field(default_factory=SwaVConfig)

    def section(self):
        """The chosen baseline's section (None for ``hypersolid``, configured by ``loss.*``)."""
        return None if self.name == "hypersolid" else getattr(self, self.name)

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first bad key and what it accepts. Only the chosen method's
        section is checked: the others are never read."""
        if self.name not in METHODS:
            raise ConfigError(f"loss.name={self.name!r} is not a known method; choose one of: {' | '.join(METHODS)}")
        section = self.section()
        if section is not None:
            _check_section(f"loss.{self.name}", section)


def _valid(kind: str, value: object) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    if isinstance(value, bool):  # bool is an int subclass: `hidden_dim: true` in YAML must not become 1
        return False
    if kind in ("pos_int", "nonneg_int", "layers"):
        return isinstance(value, int) and value >= {"pos_int": 1, "nonneg_int": 0, "layers": 2}[kind]
    if not isinstance(value, (int, float)) or value != value:  # value != value: NaN
        return False
    if kind == "pos_float":
        return 0 < value < float("inf")
    if kind == "nonneg_float":
        return 0 <= value < float("inf")
    return 0.0 <= value <= 1.0  # unit


def _check_section(prefix: str, section: object) -> None:
    kinds: dict[str, str] = type(section).KINDS
    for f in fields(section):
        value = getattr(section, f.name)
        if not _valid(kinds[f.name], value):
            raise ConfigError(f"{prefix}.{f.name}={value!r} is not allowed; it must be {_KINDS[kinds[f.name]]}")
    base, end = getattr(section, "momentum_base", None), getattr(section, "momentum_end", None)
    if base is not None and base > end:
        raise ConfigError(f"{prefix}.momentum_base={base} must be <= {prefix}.momentum_end={end} (the teacher's "
                          "EMA momentum rises from base to end)")


@dataclass
class TrainLossConfig(LossConfig, MethodConfig):
    """The ``loss`` section: which objective trains the backbone (``loss.name``, one of ``METHODS``), the
    Hypersolid loss's keys (:class:`LossConfig`, read when ``name`` is hypersolid) and each baseline's section
    (``loss.simclr.*``, ... from :class:`MethodConfig`, read only for the chosen baseline).

    One class with both parents, so that ``HypersolidLoss.from_config`` and ``build_method`` take it as is.
    """

    def validate(self) -> None:
        MethodConfig.validate(self)
        LossConfig.validate(self)


def validate_method_run(cfg: Any) -> None:
    """What a baseline (``loss.name`` other than hypersolid) cannot be combined with. ``cfg`` is the whole
    run config (``hypersolid_scale.config.Config``, a layer above this module, hence untyped here)."""
    name = cfg.loss.name
    if name == "hypersolid":
        return
    if cfg.eval.features != "backbone":
        raise ConfigError(f"eval.features={cfg.eval.features!r} reads Hypersolid's projector, which a loss.name={name} "
                          "run does not train (its heads are the method's own); set eval.features=backbone")
    # ZeRO 1/2 reduce the gradients into DeepSpeed's own partitioned buffers, out of reach of the step where
    # DINO and SwaV drop the gradients of the parts their schedules keep frozen.
    frozen = {"dino": ("loss.dino.freeze_last_layer_epochs", cfg.loss.dino.freeze_last_layer_epochs),
              "swav": ("loss.swav.freeze_prototypes_steps", cfg.loss.swav.freeze_prototypes_steps)}.get(name)
    if cfg.dist.engine == "deepspeed" and cfg.dist.zero_stage > 0 and frozen is not None and frozen[1] > 0:
        raise ConfigError(
            f"loss.name={name} with dist.engine=deepspeed and dist.zero_stage={cfg.dist.zero_stage}: {frozen[0]}="
            f"{frozen[1]} freezes part of the head by dropping its gradients before the optimizer step, which "
            "ZeRO's partitioned gradients do not allow; use dist.engine=ddp, dist.zero_stage=0, or "
            f"{frozen[0]}=0")
    if name in ("dino", "swav"):
        # These methods tell a local view from a global one by its size (lightly's multi-crop convention).
        preset = resolve_preset(cfg.data)
        if preset.num_local_views > 0 and preset.local_crop_size >= preset.global_crop_size:
            raise ConfigError(
                f"loss.name={name} tells local views from global ones by their size, but the local crops "
                f"({preset.local_crop_size} px) are not smaller than the global ones ({preset.global_crop_size} px): "
                "every view would count as global; set a smaller data.local_crop_size (e.g. 18 for 32 px "
                "CIFAR) or data.num_local_views=0")
