"""Backbones (torchvision ResNet, timm ViT, a small CPU CNN; one module each under ``backbones/``, registered by
name) and the projector MLP."""

from hypersolid_scale.models.backbones import (
    Backbone,
    backbone_names,
    build_backbone,
    get_backbone,
    register_backbone,
    unregister_backbone,
)
from hypersolid_scale.models.backbones.small_cnn import SmallCNN, SmallCNNOptions
from hypersolid_scale.models.backbones.vit import ViTBackbone, ViTOptions
from hypersolid_scale.models.config import ModelConfig
from hypersolid_scale.models.model import BackboneWithProjector, Projector

__all__ = [
    "Backbone",
    "BackboneWithProjector",
    "ModelConfig",
    "Projector",
    "SmallCNN",
    "SmallCNNOptions",
    "ViTBackbone",
    "ViTOptions",
    "backbone_names",
    "build_backbone",
    "get_backbone",
    "register_backbone",
    "unregister_backbone",
]
