"""What the qualitative analyses share: the backbone's conv stages, eval mode, PCA to RGB, input checks.

Every analysis explains the BACKBONE features ``f(x)`` (``BackboneWithProjector.embed``), the representation the
evaluation measures (kNN, linear probe, clustering); the projector only serves the training loss.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import scipy.linalg
import torch
from torch import nn

from hypersolid_scale.eval.skips import NotApplicable
from hypersolid_scale.models import SmallCNN, ViTBackbone


def backbone_of(model: nn.Module) -> nn.Module:
    """The feature extractor of a ``BackboneWithProjector`` (its ``backbone``); any other module is taken as is."""
    return getattr(model, "backbone", model)


def conv_stages(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``[(name, module)]`` whose outputs are the backbone's spatial stages, shallow to deep.

    ResNet: the four residual stages ``layer1..layer4`` (the stem is left out: its 64 channels hold edges and
    colour, which the hypercolumn of the first stage already carries at the same resolution). SmallCNN: the
    ReLU that closes each of its four conv blocks. A ViT has no conv stages: ``NotApplicable`` (its patch
    tokens are analysed by ``attention``).
    """
    net = backbone_of(model)
    if all(hasattr(net, f"layer{i}") for i in range(1, 5)):  # torchvision ResNet
        return [(f"layer{i}", getattr(net, f"layer{i}")) for i in range(1, 5)]
    if isinstance(net, SmallCNN):
        return [(f"block{k + 1}", m) for k, m in enumerate(m for m in net.features if isinstance(m, nn.ReLU))]
    if isinstance(net, ViTBackbone):
        raise NotApplicable("a ViT has no convolutional stages; see the attention analysis for its patch tokens")
    raise NotApplicable(
        f"no known convolutional stages in a {type(net).__name__} backbone (supported: torchvision ResNet, SmallCNN)"
    )


@contextmanager
def frozen_eval(model: nn.Module) -> Iterator[nn.Module]:
    """Eval mode (BatchNorm uses running statistics) for the block; the caller's train/eval mode is restored.

    Parameters keep ``requires_grad``: the analyses take gradients with ``torch.autograd.grad`` with respect
    to activations or pixels only, which never writes the parameters' ``.grad``.
    """
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


@contextmanager
def capture_outputs(modules: list[tuple[str, nn.Module]]) -> Iterator[dict[str, torch.Tensor]]:
    """``{name: output}`` of each module's latest forward call inside the block (forward hooks)."""
    seen: dict[str, torch.Tensor] = {}

    def hook_for(name: str) -> Callable[[nn.Module, object, torch.Tensor], None]:  # torch's hook signature
        def hook(_module: nn.Module, _inputs: object, output: torch.Tensor) -> None:
            seen[name] = output

        return hook

    handles = [m.register_forward_hook(hook_for(name)) for name, m in modules]
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


def check_images(images: torch.Tensor, what: str) -> torch.Tensor:
    """``images`` as float (N, C, H, W); a clear ``ValueError`` for anything else."""
    if not isinstance(images, torch.Tensor) or images.dim() != 4 or images.shape[0] == 0:
        shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
        raise ValueError(
            f"{what} expects a non-empty float tensor of images (N, C, H, W), got {shape}; "
            "stack dataset samples with torch.stack([img for img, _ in samples])"
        )
    if not images.is_floating_point():
        raise ValueError(f"{what} expects normalised float images, got dtype {images.dtype}")
    return images


def pca_rgb(features: torch.Tensor, groups: int = 1) -> torch.Tensor:
    """First three principal components of ``features`` (P, D), each min-max scaled to [0, 1]: (P, 3).

    Exact PCA (eigendecomposition of the D x D covariance), so two calls give identical output;
    the randomised ``torch.pca_lowrank`` would need a seed. Each component's sign follows sklearn's
    ``svd_flip`` convention (its largest-magnitude loading is positive), so colours do not flip between
    runs or machines. ``groups`` > 1 splits the P rows into equal consecutive groups that are min-max
    scaled separately (one image each) after a PCA fitted on all of them. Fewer than three non-constant
    directions leave the missing channels at 0.
    """
    if features.dim() != 2:
        raise ValueError(f"pca_rgb expects (pixels, channels) features, got shape {tuple(features.shape)}")
    # On the CPU whatever the model's device: the eigenproblem runs in LAPACK (scipy) anyway.
    x = features.detach().to("cpu", torch.float64)
    x = x - x.mean(dim=0, keepdim=True)
    # float32 for the (pixels x D) product (4096 x 960 for a 64 px ResNet-18 hypercolumn), float64 for the
    # eigenproblem, where near-equal eigenvalues need the precision. LAPACK's subset solver computes only the
    # three leading eigenvectors: several times faster than torch.linalg.eigh's full decomposition at D ~ 1000.
    x32 = x.to(torch.float32)
    cov = ((x32.T @ x32).to(torch.float64) / max(x.shape[0] - 1, 1)).numpy()
    d = cov.shape[0]
    k = min(3, d)
    _, evecs = scipy.linalg.eigh(cov, subset_by_index=[d - k, d - 1])  # ascending eigenvalues
    comps = torch.from_numpy(np.ascontiguousarray(evecs[:, ::-1]))  # (D, k), largest variance first
    # svd_flip: make each component's largest-|loading| entry positive
    signs = torch.sign(comps.gather(0, comps.abs().argmax(dim=0, keepdim=True)))
    comps = comps * torch.where(signs == 0, torch.ones_like(signs), signs)
    proj = x @ comps  # (P, k)
    rgb = torch.zeros(x.shape[0], 3, dtype=torch.float64)
    rgb[:, :k] = proj
    rgb = rgb.view(groups, -1, 3)
    lo = rgb.amin(dim=1, keepdim=True)
    span = rgb.amax(dim=1, keepdim=True) - lo
    # A (near-)constant component carries no structure: show it as 0 rather than amplify rounding noise.
    scaled = torch.where(span > 1e-12, (rgb - lo) / span.clamp_min(1e-12), torch.zeros_like(rgb))
    return scaled.reshape(-1, 3).to(torch.float32)


def to_display(images: torch.Tensor, mean: Sequence[float] | None, std: Sequence[float] | None) -> np.ndarray:
    """Normalised (N, C, H, W) images -> (N, H, W, C) floats in [0, 1] for plotting.

    With the dataset's ``mean``/``std`` the normalisation is undone and the result clipped to [0, 1]; without
    them each image is min-max scaled (its contrast is kept, its absolute brightness is not).
    """
    x = images.detach().to("cpu", torch.float32)
    if mean is not None and std is not None:
        if len(mean) != x.shape[1] or len(std) != x.shape[1]:
            raise ValueError(
                f"mean/std have {len(mean)}/{len(std)} entries for {x.shape[1]}-channel images; "
                "pass the dataset preset's mean and std (one value per channel)"
            )
        m = torch.tensor(mean).view(1, -1, 1, 1)
        s = torch.tensor(std).view(1, -1, 1, 1)
        x = (x * s + m).clamp(0.0, 1.0)
    else:
        flat = x.flatten(1)
        lo = flat.amin(dim=1).view(-1, 1, 1, 1)
        span = (flat.amax(dim=1) - flat.amin(dim=1)).view(-1, 1, 1, 1)
        x = torch.where(span > 0, (x - lo) / span.clamp_min(1e-12), torch.zeros_like(x))
    return x.permute(0, 2, 3, 1).cpu().numpy()


def stretch_display(images: torch.Tensor, quantile: float = 0.01) -> np.ndarray:
    """(N, C, H, W) -> (N, H, W, C) in [0, 1], each image's ``quantile`` .. ``1 - quantile`` range stretched to
    [0, 1] and clipped: synthesised images (feature inversions) are faint and hold a few extreme pixels, which
    a plain min-max would let set the scale."""
    x = images.detach().to("cpu", torch.float32)
    flat = x.flatten(1)
    lo = flat.quantile(quantile, dim=1).view(-1, 1, 1, 1)
    hi = flat.quantile(1.0 - quantile, dim=1).view(-1, 1, 1, 1)
    span = hi - lo
    x = torch.where(span > 0, ((x - lo) / span.clamp_min(1e-12)).clamp(0.0, 1.0), torch.zeros_like(x))
    return x.permute(0, 2, 3, 1).cpu().numpy()
