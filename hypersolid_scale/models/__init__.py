"""Backbones (torchvision ResNet, timm ViT, a small CPU CNN) and the projector MLP."""

from hypersolid_scale.models.backbones import SmallCNN, ViTBackbone, build_backbone
from hypersolid_scale.models.config import ARCHS, ModelConfig
from hypersolid_scale.models.model import HypersolidModel, Projector, build_model, group_views_by_resolution

__all__ = [
    "ARCHS",
    "HypersolidModel",
    "ModelConfig",
    "Projector",
    "SmallCNN",
    "ViTBackbone",
    "build_backbone",
    "build_model",
    "group_views_by_resolution",
]
