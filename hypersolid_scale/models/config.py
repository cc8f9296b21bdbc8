"""Model configuration: the backbone (the section ``model``).

The paper fixes the backbones (ResNet-18 for CIFAR/STL-10/Food-101, ResNet-50 for ImageNet, ViT-Tiny/16 for the
STL-10 transformer run). The heads on top are each method's own, configured in its section ``method.<name>``
(Hypersolid's projector: ``method.hypersolid.{num_layers,hidden_dim,out_dim}``).

Which settings apply to which backbone is the backbone's registration (`hypersolid_scale.models.backbones`):
`ModelConfig.validate` asks the registry, so a new backbone needs no change here.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypersolid_scale.models.backbones import backbone_names, get_backbone

CHANNELS_LAST = ("auto", "true", "false")


@dataclass
class ModelConfig:
    """Backbone hyperparameters.

    Attributes:
        arch: a registered backbone (``backbone_names()``): ``small_cnn`` (CPU runs on 28-32 px data),
            ``resnet18``, ``resnet50``, ``vit_tiny``, or one registered with ``register_backbone``.
        in_channels: image channels (1 for Fashion-MNIST, 3 for RGB).
        small_stem: backbones registered with ``small_stem=True`` only (the ResNets). CIFAR-style stem (3x3
            conv, stride 1, no max-pool) so 32 px inputs are not downsampled 4x before the first residual stage.
        small_cnn_width: channels of the small CNN's first block; later blocks use 2x, 4x, 4x this width.
        img_size: ViT only. Nominal input size that sizes the position-embedding grid; other sizes (local
            crops) are served by interpolating that grid.
        patch_size: ViT only. Input sizes must be multiples of it.
        channels_last: ``auto | true | false``: the model's weights and the views it is given in channels-last
            memory format (NHWC), which the GPU's convolution kernels run fastest on. ``auto``: on CUDA, for a
            convolutional backbone (more than one 2-D convolution: not a ViT, whose only one is its patch
            embedding). Results equal the NCHW run's within float rounding (tests/test_channels_last.py).
    """

    arch: str = "small_cnn"
    in_channels: int = 3
    small_stem: bool = False
    small_cnn_width: int = 32
    img_size: int = 224
    patch_size: int = 16
    channels_last: str = "auto"

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the bad field and the fix. Called on construction and by build_backbone
        (fields may be changed after construction, e.g. by config overrides)."""
        backbone = get_backbone(self.arch)  # ValueError listing the registered names
        for name in ("in_channels", "small_cnn_width", "img_size", "patch_size"):
            value = getattr(self, name)
            # bool is an int subclass; reject it so `in_channels: true` in YAML does not become 1.
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"model.{name}={value!r} must be a positive integer")
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
