"""ViT attention maps and patch-token PCA (the paper's appendix on Vision Transformers, Fig. "Qualitative
analysis of a ViT-Tiny trained on STL-10").

- CLS attention: in the LAST block, each head's softmax attention from the CLS token to every patch token,
  on the patch grid. timm's fused attention never materialises these weights, so they are recomputed from
  the block's own ``qkv`` projection (and q/k norms) applied to the block's attention input.
- Patch-token PCA: the final-norm output tokens of the patches, three principal components as RGB on the
  patch grid ("blocky": one colour per patch).

Other backbones have no attention: ``NotApplicable``, which the evaluation records as a skip.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hypersolid_scale.eval.qualitative._common import backbone_of, check_images, frozen_eval, pca_rgb
from hypersolid_scale.eval.skips import NotApplicable
from hypersolid_scale.models import ViTBackbone


@dataclass
class AttentionMaps:
    """Result of ``vit_attention``.

    Attributes:
        cls_attention: (N, heads, gh, gw) CLS -> patch attention of the last block; each head's weights over
            ALL tokens sum to 1 (the CLS token's attention to itself and to register tokens is left out here).
        patch_pca: (N, gh, gw, 3) floats in [0, 1], per-image PCA of the final patch tokens.
        grid: (gh, gw) patch grid of the input.
    """

    cls_attention: torch.Tensor
    patch_pca: torch.Tensor
    grid: tuple[int, int]


def _vit_of(model: nn.Module) -> ViTBackbone:
    net = backbone_of(model)
    if not isinstance(net, ViTBackbone):
        raise NotApplicable(f"attention maps need a ViT backbone; this model's backbone is a {type(net).__name__}")
    return net


@torch.no_grad()
def vit_attention(model: nn.Module, images: torch.Tensor) -> AttentionMaps:
    """Last-block CLS attention per head and patch-token PCA of a ViT model.

    Raises:
        NotApplicable: the backbone is not a ViT.
        ValueError: the image size is not a multiple of the patch size.
    """
    images = check_images(images, "vit_attention")
    net = _vit_of(model)
    h, w = images.shape[-2:]
    p = net.patch_size
    if h % p or w % p:
        raise ValueError(f"image size {h}x{w} is not a multiple of the ViT patch size {p}; resize the images")
    grid = (h // p, w // p)
    vit: Any = net.vit  # timm's VisionTransformer
    attn = vit.blocks[-1].attn
    seen: dict[str, torch.Tensor] = {}
    handle = attn.register_forward_pre_hook(lambda _m, args: seen.__setitem__("x", args[0]))
    try:
        with frozen_eval(model):
            tokens = vit.forward_features(images)  # (N, prefix + gh * gw, D), after the final norm
    finally:
        handle.remove()
    x = seen["x"]
    n, t, _ = x.shape
    qkv = attn.qkv(x).reshape(n, t, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    q, k = attn.q_norm(qkv[0]), attn.k_norm(qkv[1])
    weights = ((q * attn.scale) @ k.transpose(-2, -1)).softmax(dim=-1)  # (N, heads, T, T)
    prefix = vit.num_prefix_tokens
    cls_attention = weights[:, :, 0, prefix:].reshape(n, attn.num_heads, *grid)
    patches = tokens[:, prefix:, :].float()  # (N, gh * gw, D)
    patch_pca = torch.stack([pca_rgb(pt) for pt in patches]).view(n, *grid, 3)
    return AttentionMaps(cls_attention=cls_attention.float(), patch_pca=patch_pca, grid=grid)
