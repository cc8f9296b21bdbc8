"""The registry of backbones (model.arch): images (N, C, H, W) -> features (N, F).

Every module of this package defines one family of backbones and registers each by name with
`register_backbone`; `get_backbone`, `backbone_names` and `build_backbone` import them all on first use
(``python -m hypersolid_scale.models.backbones`` lists them). A new
backbone is one new module here (plus its tests): its builder, and what is specific to it — its own config keys
(``options``: the section ``model.<name>``, e.g. ``model.small_cnn.width``), whether ``model.small_stem``
applies, extra validation of the config, its export layout (`ExportLayout`: the library model it is, for
``hypersolid_scale.export``) — in its registration. `ModelConfig.validate`
asks this registry, so it names no architecture itself. Modules here stay cheap to import: torchvision and
timm are imported inside the builders, so validating a config does not load them.

Every backbone here is randomly initialised (self-supervised training from scratch; no weights are downloaded)
and ends in a global pooling so that any input resolution maps to one F-dimensional vector — needed because
global and local crops have different sizes.

A backbone registered at run time (a script, a test) is built like the ones here::

    @register_backbone("tiny_conv")
    def _tiny(cfg: ModelConfig) -> tuple[nn.Module, int]:
        return nn.Sequential(nn.Conv2d(cfg.in_channels, 8, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten()), 8

    build_backbone(ModelConfig(arch="tiny_conv"))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hypersolid_scale.config.registry import DEFAULT_ORDER, Registry

if TYPE_CHECKING:
    from torch import nn

    from hypersolid_scale.models.config import ModelConfig

# build(cfg) -> (backbone, feature_dim): the module maps (N, cfg.in_channels, H, W) to (N, feature_dim).
Builder = Callable[["ModelConfig"], "tuple[nn.Module, int]"]


@dataclass(frozen=True)
class ExportLayout:
    """A backbone as the library model it is (``hypersolid_scale.export``, docs/export.md).

    Attributes:
        library: ``torchvision``, ``timm``, or None (this package's own module, exported as it is).
        name: the library's model name (its constructor), or the package's arch for ``library=None``.
        describe: ``describe(model) -> fields``: from a config's ``model`` section, what ``export.json`` records
            to rebuild the module beyond the common fields (arch, library, channels): its constructor call, its
            stem or sizes, a note.
        build: ``build(meta) -> (module, feature_dim)``: the library's module as ``export.json``'s fields
            describe it, without a classifier (called on the meta device: no weights are initialised).
        inner: the prefix of the library module inside the package's backbone (``vit.`` for the ViT).
    """

    library: str | None
    name: str
    describe: Callable[[Mapping[str, Any]], dict[str, Any]]
    build: Callable[[Mapping[str, Any]], tuple[nn.Module, int]]
    inner: str = ""


@dataclass(frozen=True)
class Backbone:
    """A registered backbone: its builder and the settings specific to it.

    Attributes:
        name: the ``model.arch`` value that selects it.
        build: ``build(cfg) -> (module, feature_dim)``; called with a validated config.
        small_stem: ``model.small_stem=true`` applies (the builder then uses a stem for 32 px inputs);
            otherwise that setting is rejected.
        check: extra validation of the config, called by ``ModelConfig.validate`` after the checks common to
            all backbones; raises ValueError naming the bad field and the fix.
        input_multiple: ``input_multiple(cfg) -> (n, key, sizes)`` for a backbone whose input sides must be
            multiples of ``n`` (the ViT's patch size, the config key ``key``): every view size is checked against
            it when the config is validated (``config/combinations.py``); ``sizes``: its own sizes that ``n`` must
            divide too (``{key: size}``, the ViT's ``img_size``), which a suggested ``n`` divides. None: any size.
        order: its place in `backbone_names()` (then by name); the default, ``small_cnn``, comes first.
        export: how ``hypersolid_scale.export`` writes it in its library's layout; None: it cannot be exported.
        options: its own config keys, the section ``model.<name>``: a dataclass with defaults (its int fields
            must be positive); the builder reads them as ``cfg.section()``. None: it has none. The section is
            part of the config schema of a backbone found at import (a module of this package), as a method's.
    """

    name: str
    build: Builder
    small_stem: bool = False
    check: Callable[[ModelConfig], None] | None = None
    order: int = DEFAULT_ORDER
    input_multiple: Callable[[ModelConfig], tuple[int, str, dict[str, int]]] | None = None
    export: ExportLayout | None = None
    options: type | None = None


BACKBONES: Registry[Backbone] = Registry(
    "backbone", "model.arch", "hypersolid_scale.models.backbones", documented_by=lambda b: b.build
)


def register_backbone(
    name: str,
    *,
    small_stem: bool = False,
    check: Callable[[ModelConfig], None] | None = None,
    order: int = DEFAULT_ORDER,
    input_multiple: Callable[[ModelConfig], tuple[int, str, dict[str, int]]] | None = None,
    export: ExportLayout | None = None,
    options: type | None = None,
) -> Callable[[Builder], Builder]:
    """Decorator registering ``build(cfg) -> (module, feature_dim)`` as the backbone ``name`` (see `Backbone`
    for the options). Returns the builder unchanged, so one builder may be registered under several names."""

    def decorator(build: Builder) -> Builder:
        BACKBONES.register(name, Backbone(name, build, small_stem, check, order, input_multiple, export, options))
        return build

    return decorator


def unregister_backbone(name: str) -> Backbone | None:
    """Remove the backbone ``name`` (one registered at run time, e.g. by a test) and return its entry."""
    return BACKBONES.unregister(name)


def backbone_names() -> tuple[str, ...]:
    """The registered backbones: ``small_cnn`` (the default, for CPU runs) first, then by name."""
    return BACKBONES.names()


def get_backbone(name: str) -> Backbone:
    """The registered backbone ``name``; a ConfigError listing the registered names when there is none."""
    return BACKBONES.get(name)


def build_backbone(cfg: ModelConfig) -> tuple[nn.Module, int]:
    """Return (backbone, feature_dim) for ``cfg.arch``."""
    cfg.validate()
    return get_backbone(cfg.arch).build(cfg)
