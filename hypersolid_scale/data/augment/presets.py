"""Multi-crop presets: the paper's augmentation table (Sec. "Training Augmentations") as data.

Every preset describes 2 global + N local views. Columns of the paper's table map 1:1 to fields; the
library defaults are lightly's ``DINOTransform`` defaults (ImageNet-1k, Food-101). Two presets are this
project's own, for the small grayscale datasets of the quickstart (values chosen like the paper's CIFAR
column, i.e. no blur on tiny images; see the comments on them).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from hypersolid_scale.data.config import DataConfig
from hypersolid_scale.safety.errors import ConfigError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class MultiCropPreset:
    global_crop_size: int = 224
    global_crop_scale: tuple[float, float] = (0.4, 1.0)
    local_crop_size: int = 96
    local_crop_scale: tuple[float, float] = (0.05, 0.4)
    num_local_views: int = 6
    hflip_prob: float = 0.5
    cj_prob: float = 0.8
    cj_strength: float = 0.5
    # (brightness, contrast, saturation, hue) before multiplying by cj_strength.
    cj_factors: tuple[float, float, float, float] = (0.8, 0.8, 0.4, 0.2)
    gray_prob: float = 0.2
    # Blur probability for (global_0, global_1, every local view), as in DINO.
    blur_probs: tuple[float, float, float] = (1.0, 0.1, 0.5)
    blur_sigmas: tuple[float, float] = (0.1, 2.0)
    # Applied to global_1 only (DINO's recipe, lightly's DINOTransform).
    solarize_prob: float = 0.2
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    channels: int = 3
    # Eval: resize the short side to this, then center-crop global_crop_size.
    eval_resize: int = 256
    name: str = field(default="default", compare=False)

    @property
    def num_views(self) -> int:
        return 2 + self.num_local_views

    def view_sizes(self) -> list[int]:
        return [self.global_crop_size] * 2 + [self.local_crop_size] * self.num_local_views

    def view_scales(self) -> list[tuple[float, float]]:
        return [self.global_crop_scale] * 2 + [self.local_crop_scale] * self.num_local_views

    def view_blur_probs(self) -> list[float]:
        return [self.blur_probs[0], self.blur_probs[1]] + [self.blur_probs[2]] * self.num_local_views

    def view_solarize_probs(self) -> list[float]:
        return [0.0, self.solarize_prob] + [0.0] * self.num_local_views

    def jitter_ranges(self) -> tuple[float, float, float, float]:
        b, c, s, h = self.cj_factors
        k = self.cj_strength
        return (b * k, c * k, s * k, h * k)


_DEFAULT = MultiCropPreset(name="default")
_CIFAR = replace(
    _DEFAULT,
    name="cifar",
    global_crop_size=32,
    global_crop_scale=(0.8, 1.0),
    local_crop_size=32,
    local_crop_scale=(0.08, 0.9),
    blur_probs=(0.0, 0.0, 0.0),
    eval_resize=32,
)
# Fashion-MNIST (28 px, one channel): full-resolution global views at CIFAR-like scales (objects fill the
# frame, so a 0.6 floor keeps the garment recognisable), 16 px local views of 10-50 % of the image (cheap
# for the CPU quickstart), no blur (as for CIFAR: a 2 px sigma erases a 28 px image). Jitter, grayscale
# and solarization keep the paper's probabilities; saturation/hue/grayscale are no-ops on one channel.
_FASHION_MNIST = replace(
    _DEFAULT,
    name="fashion_mnist",
    global_crop_size=28,
    global_crop_scale=(0.6, 1.0),
    local_crop_size=16,
    local_crop_scale=(0.1, 0.5),
    blur_probs=(0.0, 0.0, 0.0),
    mean=(0.2860,),
    std=(0.3530,),
    channels=1,
    eval_resize=28,
)
# sklearn digits (8 px, 17 grey levels): crops are upsampled to 16/8 px so a small CNN has something to
# look at; otherwise as Fashion-MNIST. Mean/std of the [0, 1]-scaled images.
_DIGITS = replace(
    _FASHION_MNIST,
    name="digits",
    global_crop_size=16,
    local_crop_size=8,
    local_crop_scale=(0.2, 0.6),
    mean=(0.3059,),
    std=(0.3838,),
    eval_resize=16,
)

PRESETS: dict[str, MultiCropPreset] = {
    "default": _DEFAULT,
    "imagenet": replace(_DEFAULT, name="imagenet"),
    "food101": replace(_DEFAULT, name="food101"),
    "cifar": _CIFAR,
    "cifar10": replace(_CIFAR, name="cifar10"),
    "cifar100": replace(_CIFAR, name="cifar100"),
    "stl10": replace(_DEFAULT, name="stl10", global_crop_size=96, local_crop_size=48, eval_resize=96),
    # ViT: local views at the global resolution (paper table, "ViT: 224").
    "vit": replace(_DEFAULT, name="vit", local_crop_size=224),
    "fashion_mnist": _FASHION_MNIST,
    "digits": _DIGITS,
}

# preset=auto: data.dataset -> preset; any other name (or none) -> "default".
_DATASET_PRESET = {
    name: name for name in ("fashion_mnist", "digits", "cifar10", "cifar100", "stl10", "food101", "imagenet")
}
_DATASET_PRESET.update(imagenet1k="imagenet", imagenet100="imagenet")


def auto_preset_name(cfg: DataConfig) -> str:
    """The preset preset=auto picks: the one named like the dataset, else "default"."""
    dataset = cfg.builtin_name() if cfg.format == "builtin" else cfg.dataset
    return _DATASET_PRESET.get((dataset or "").lower(), "default")


def resolve_preset(cfg: DataConfig) -> MultiCropPreset:
    """The preset named by ``cfg.preset`` (``auto``: the dataset's own), with the config's overrides."""
    name = cfg.preset if cfg.preset != "auto" else auto_preset_name(cfg)
    if name not in PRESETS:
        raise ConfigError(f"data.preset={name!r} is unknown; choose one of {sorted(PRESETS)} or 'auto'")
    preset = PRESETS[name]
    overrides: dict = {}
    for key in ("num_local_views", "global_crop_size", "local_crop_size"):
        if getattr(cfg, key) is not None:
            overrides[key] = int(getattr(cfg, key))
    for key in ("global_crop_scale", "local_crop_scale"):
        if getattr(cfg, key) is not None:
            overrides[key] = (float(getattr(cfg, key)[0]), float(getattr(cfg, key)[1]))
    if cfg.global_crop_size is not None:
        # Keep the preset's resize/crop ratio (256/224 for ImageNet, 1 for tiny images).
        ratio = preset.eval_resize / preset.global_crop_size
        overrides["eval_resize"] = int(round(cfg.global_crop_size * ratio))
    return replace(preset, **overrides)


def normalize_dict(preset: MultiCropPreset) -> dict[str, list[float]]:
    return {"mean": list(preset.mean), "std": list(preset.std)}
