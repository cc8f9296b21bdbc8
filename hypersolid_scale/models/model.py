"""The projector MLP (Hypersolid's head), and :class:`BackboneWithProjector`, the model evaluation loads any
method's checkpoint into: the backbone and that method's projection head.

It has no training forward: a run trains the backbone through its method's own ``embed``/``loss``
(:mod:`hypersolid_scale.methods`; the multi-crop batching by resolution is ``methods.base.encode``), and
evaluation reads ``embed`` (backbone features) or ``projector`` (``eval.features=projector``).
"""

from __future__ import annotations

import torch
from torch import nn


class Projector(nn.Module):
    """MLP from backbone features to the loss space: (Linear-BN-ReLU) x (layers-1), then Linear.

    With several processes its BatchNorm1d, like every BN layer, normalises over the global batch: the engine
    converts it to torch's SyncBatchNorm on CUDA and to ``GlobalBatchNorm`` on CPU (``dist.sync_bn``).

    Shape:
        (N, in_dim) -> (N, out_dim)
    """

    def __init__(self, in_dim: int, hidden_dim: int, out_dim: int, layers: int) -> None:
        super().__init__()
        if layers < 1:
            raise ValueError(f"projector layers={layers} must be >= 1")
        blocks: list[nn.Module] = []
        prev = in_dim
        for _ in range(layers - 1):
            # bias=False: BatchNorm's shift follows immediately.
            blocks += [nn.Linear(prev, hidden_dim, bias=False), nn.BatchNorm1d(hidden_dim), nn.ReLU(inplace=True)]
            prev = hidden_dim
        blocks.append(nn.Linear(prev, out_dim))
        self.net = nn.Sequential(*blocks)
        self.out_dim = out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class BackboneWithProjector(nn.Module):
    """Backbone + the method's projection head, for evaluation (``checkpoint.build_model_from_checkpoint``); no
    ``forward``.

    Attributes:
        backbone: images (N, C, H, W) -> features (N, F)
        projector: (N, F) -> (N, D), the method's projection head (``Method.projection_head``); None for a
            method without one
        feature_dim: F
    """

    def __init__(self, backbone: nn.Module, feature_dim: int, projector: nn.Module | None) -> None:
        super().__init__()
        self.backbone = backbone
        self.projector = projector
        self.feature_dim = feature_dim

    @torch.no_grad()
    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """Backbone features (N, F) for evaluation (kNN, linear probe, clustering). No gradients; the caller
        chooses train/eval mode (use eval mode so BatchNorm uses running statistics)."""
        return self.backbone(images)
