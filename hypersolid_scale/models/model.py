"""HypersolidModel: backbone + projector, with multi-crop forwarding grouped by resolution.

Global and local crops have different sizes, so they cannot be stacked into one tensor. Running the backbone
once per view wastes kernel launches and gives BatchNorm tiny batches; instead views of equal size are
concatenated and run in ONE backbone call per distinct resolution (the multi-crop trick of DINO). All features
then go through ONE projector call, so the projector's BatchNorm sees every view of the batch together.
"""

from __future__ import annotations

import torch
from torch import nn

from hypersolid_scale.models.backbones import build_backbone
from hypersolid_scale.models.config import ModelConfig


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


def group_views_by_resolution(views: list[torch.Tensor]) -> list[list[int]]:
    """Indices of views sharing a (C, H, W) shape, groups in order of first appearance.

    >>> # [224, 224, 96, 96, 96] -> [[0, 1], [2, 3, 4]]
    """
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, v in enumerate(views):
        groups.setdefault(tuple(v.shape[1:]), []).append(i)
    return list(groups.values())


class HypersolidModel(nn.Module):
    """Backbone + projector.

    Attributes:
        backbone: images (N, C, H, W) -> features (N, F)
        projector: (N, F) -> (N, D)
        feature_dim: F
        proj_dim: D
    """

    def __init__(self, backbone: nn.Module, feature_dim: int, projector: Projector) -> None:
        super().__init__()
        self.backbone = backbone
        self.projector: nn.Module = projector  # NoProjector in a baseline's evaluation model
        self.feature_dim = feature_dim
        self.proj_dim = projector.out_dim

    def forward(self, views: list[torch.Tensor]) -> torch.Tensor:
        """Project every view of every image.

        Args:
            views: list of V tensors (B, C, H_v, W_v) ordered [global_0, global_1, local_0, ...]; sizes may differ
                between views but B and C may not.

        Returns:
            (B, V, D) projector outputs, view order as given (the loss's max-pool target spans all V).
        """
        self._check_views(views)
        batch = views[0].shape[0]
        groups = group_views_by_resolution(views)
        # One backbone call per resolution: (len(g) * B, C, H, W) -> (len(g) * B, F)
        feats = torch.cat([self.backbone(torch.cat([views[i] for i in g])) for g in groups])
        z = self.projector(feats)  # (V * B, D), views in group order
        order = [i for g in groups for i in g]  # order[k] = original index of the k-th concatenated view
        z = z.view(len(views), batch, -1)
        if order != list(range(len(views))):
            inverse = torch.empty(len(order), dtype=torch.long)
            inverse[torch.tensor(order)] = torch.arange(len(order))
            z = z[inverse.to(z.device)]
        return z.transpose(0, 1).contiguous()  # (V, B, D) -> (B, V, D)

    @torch.no_grad()
    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """Backbone features (N, F) for evaluation (kNN, linear probe, clustering). No gradients; the caller
        chooses train/eval mode (use eval mode so BatchNorm uses running statistics)."""
        return self.backbone(images)

    @staticmethod
    def _check_views(views: list[torch.Tensor]) -> None:
        if isinstance(views, torch.Tensor) or not isinstance(views, (list, tuple)) or len(views) == 0:
            raise ValueError(
                "HypersolidModel.forward expects a non-empty list of view tensors (B, C, H, W); "
                "for a single image batch call model([images]) or model.embed(images)"
            )
        first = views[0]
        for i, v in enumerate(views):
            if v.dim() != 4 or first.dim() != 4 or v.shape[:2] != first.shape[:2]:
                raise ValueError(
                    f"view {i} has shape {tuple(v.shape)}; every view must be (B, C, H, W) with the same B and C "
                    f"as view 0 {tuple(views[0].shape)}"
                )


def build_model(cfg: ModelConfig) -> HypersolidModel:
    """Build the backbone named by ``cfg.arch`` and its projector to ``cfg.proj_dim``."""
    cfg.validate()
    backbone, feature_dim = build_backbone(cfg)
    projector = Projector(feature_dim, cfg.proj_hidden_dim, cfg.proj_dim, cfg.proj_layers)
    return HypersolidModel(backbone, feature_dim, projector)
