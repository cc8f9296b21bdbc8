"""Model configuration: the backbone (the section ``model``).

The paper fixes the backbones (ResNet-18 for CIFAR/STL-10/Food-101, ResNet-50 for ImageNet, ViT-Tiny/16 for the
STL-10 transformer run). The heads on top are each method's own, configured in its section ``method.<name>``
(Hypersolid's projector: ``method.hypersolid.{num_layers,hidden_dim,out_dim}``).

The keys every backbone reads (``arch``, ``in_channels``, ``small_stem``, ``channels_last``) sit in ``model``; a
backbone's own keys in its section ``model.<arch>`` (``model.small_cnn.width``, ``model.vit_tiny.patch_size``),
built from its registration (`hypersolid_scale.models.backbones`, ``options``) as a method's section is from the
method registry. Which settings apply to which backbone is its registration too: `ModelConfig.validate` asks
the registry, so a new backbone, its keys included, needs no change here. Earlier versions had the backbones'
keys flat (``model.small_cnn_width``, ``model.img_size``, ``model.patch_size``): ``config/former_keys.py``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hypersolid_scale.config.sections import chosen_only, drop_missing, sectioned_class
from hypersolid_scale.models.backbones import backbone_names, get_backbone

CHANNELS_LAST = ("auto", "true", "false")


class ModelConfigBase:
    """What the ``model`` section's class (:data:`ModelConfig`, built from the registry) holds besides its fields.

    Attributes:
        arch: a registered backbone (``backbone_names()``): ``small_cnn`` (CPU runs on 28-32 px data),
            ``resnet18``, ``resnet50``, ``vit_tiny``, or one registered with ``register_backbone``.
        in_channels: image channels (1 for Fashion-MNIST, 3 for RGB).
        small_stem: backbones registered with ``small_stem=True`` only (the ResNets). CIFAR-style stem (3x3
            conv, stride 1, no max-pool) so 32 px inputs are not downsampled 4x before the first residual stage.
        channels_last: ``auto | true | false``: the model's weights and the views it is given in channels-last
            memory format (NHWC), which the GPU's convolution kernels run fastest on. ``auto``: on CUDA, for a
            convolutional backbone (more than one 2-D convolution: not a ViT, whose only one is its patch
            embedding). Results equal the NCHW run's within float rounding (tests/test_channels_last.py).
        <arch>: each registered backbone's own section (its ``options``), read only when it is the chosen one.
    """

    arch: str
    in_channels: int
    small_stem: bool
    channels_last: str

    def __post_init__(self) -> None:
        self.validate()

    def section(self) -> Any:
        """The chosen backbone's own section (``model.<arch>``); None for a backbone without keys of its own."""
        return getattr(self, self.arch, None) if get_backbone(self.arch).options is not None else None

    def validate(self) -> None:
        """Raise ValueError naming the bad field and the fix. Called on construction and by build_backbone
        (fields may be changed after construction, e.g. by config overrides)."""
        backbone = get_backbone(self.arch)  # ValueError listing the registered names
        section = self.section()
        ints = [("model.in_channels", self.in_channels)]
        if section is not None:
            ints += [
                (f"model.{self.arch}.{f.name}", getattr(section, f.name))
                for f in dataclasses.fields(section)
                if f.type in (int, "int")
            ]
        for key, value in ints:
            # bool is an int subclass; reject it so `in_channels: true` in YAML does not become 1.
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{key}={value!r} must be a positive integer")
        self.channels_last = str(self.channels_last).lower()  # YAML reads `true` as a bool
        if self.channels_last not in CHANNELS_LAST:
            raise ValueError(f"model.channels_last={self.channels_last!r} is not one of {CHANNELS_LAST}")
        if self.small_stem and not backbone.small_stem:
            stems = [n for n in backbone_names() if get_backbone(n).small_stem]
            raise ValueError(
                f"model.small_stem=true only applies to {stems}, not arch={self.arch!r}; "
                f"set model.small_stem=false (it selects a stem for 32 px inputs, which {self.arch} does not have)"
            )
        if backbone.check is not None:
            backbone.check(self)  # the backbone's own fields, e.g. the ViT's img_size and patch_size


def backbone_sections() -> dict[str, type]:
    """The registered backbones with a section ``model.<name>``: name -> its options dataclass."""
    return {n: options for n in backbone_names() if (options := get_backbone(n).options) is not None}


# The ``model`` section: its common fields and one section per registered backbone with keys of its own.
ModelConfig: Any = sectioned_class(
    "ModelConfig",
    __name__,
    [("arch", str, "small_cnn"), ("in_channels", int, 3), ("small_stem", bool, False), ("channels_last", str, "auto")],
    backbone_sections(),
    base=ModelConfigBase,
)


def chosen_model_section(model: dict[str, Any]) -> dict[str, Any]:
    """A ``model`` section (a nested dict) with only the chosen backbone's own section (what a checkpoint
    stores)."""
    return chosen_only(model, "arch", "small_cnn", backbone_sections())


def drop_missing_model_sections(d: dict[str, Any], where: str) -> dict[str, Any]:
    """``d`` (a stored nested config dict) without the ``model.<arch>`` sections of backbones not installed here
    (config/sections.py)."""
    return drop_missing(d, where, "model", "backbones", {f.name for f in dataclasses.fields(ModelConfig)})
