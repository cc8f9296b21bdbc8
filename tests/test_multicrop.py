"""The one multi-crop forward (methods/base.py ``encode``/``project``, Hypersolid's ``embed_views``): views of
equal size in one backbone call, output in view order, equal to the per-view loop; one projector call over
every view; a gradient to every parameter."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hypersolid_scale.methods.base import encode, group_views_by_resolution, project
from hypersolid_scale.methods.hypersolid import Hypersolid, HypersolidConfig
from hypersolid_scale.models import ModelConfig, ViTOptions, build_backbone

SMALL_PROJ = HypersolidConfig(hidden_dim=64, out_dim=32)  # the projector is not what these tests exercise


def _views(batch: int, sizes: list[int], seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, 3, s, s, generator=g) for s in sizes]


def _build(arch: str, **extra) -> tuple[nn.Module, Hypersolid]:
    torch.manual_seed(0)
    backbone, feature_dim = build_backbone(ModelConfig(arch=arch, **extra))
    return backbone, Hypersolid(feature_dim, SMALL_PROJ)


def _grouped(backbone: nn.Module, head: nn.Module, views: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack(project(head, encode(backbone, views, separate=False), separate=False), dim=1)


def test_group_views_by_resolution_order() -> None:
    assert group_views_by_resolution(_views(1, [32, 16, 32, 16, 8])) == [[0, 2], [1, 3], [4]]


@pytest.mark.parametrize(
    "arch,extra,sizes",
    [
        ("small_cnn", {}, [28, 28, 12, 12, 12]),
        ("small_cnn", {}, [12, 28, 12, 28, 20]),  # interleaved: the output must come back in input order
        ("resnet18", {"small_stem": True}, [16, 8, 16, 8]),
        ("vit_tiny", {}, [64, 32, 64]),
    ],
)
def test_grouped_forward_equals_per_view_loop(arch: str, extra: dict, sizes: list[int]) -> None:
    backbone, method = _build(arch, **extra)
    # A few train-mode passes give BatchNorm non-trivial running stats, so eval mode is not an identity.
    with torch.no_grad():
        for _ in range(2):
            _grouped(backbone, method.projector, _views(4, sizes, seed=1))
    backbone.eval(), method.eval()
    views = _views(3, sizes, seed=2)
    with torch.no_grad():
        grouped = _grouped(backbone, method.projector, views)
        # The obvious loop, valid in eval mode (BatchNorm does not depend on which samples share a call).
        reference = torch.stack([method.projector(backbone(v)) for v in views], dim=1)
        if sizes == sorted(sizes, reverse=True):  # global views first, as a method receives them
            torch.testing.assert_close(method.embed_views(views, backbone), grouped, rtol=0, atol=0)
    torch.testing.assert_close(grouped, reference, rtol=1e-4, atol=1e-5)
    # Distinct views must give distinct outputs: catches a permutation bug that copies one view everywhere.
    assert not torch.allclose(grouped[:, 0], grouped[:, 1])


@pytest.mark.parametrize(
    "sizes,expected_calls", [([28, 28, 12, 12, 12, 12], 2), ([28, 12, 28, 20, 12], 3), ([28], 1), ([28, 28], 1)]
)
def test_one_backbone_call_per_resolution(sizes: list[int], expected_calls: int) -> None:
    backbone, _ = _build("small_cnn")
    calls: list[tuple[int, ...]] = []
    backbone.register_forward_hook(lambda _m, inp, _out: calls.append(tuple(inp[0].shape)))
    encode(backbone, _views(4, sizes), separate=False)
    assert len(calls) == expected_calls
    # Each call carries every view of that size: (n_views_of_size * B, C, H, W).
    for shape in calls:
        assert shape[0] == 4 * sizes.count(shape[-1])


def test_projector_called_once_and_gradients_reach_all_views() -> None:
    backbone, method = _build("small_cnn")
    proj_calls: list[int] = []
    method.projector.register_forward_hook(lambda _m, inp, _o: proj_calls.append(inp[0].shape[0]))
    views = [v.requires_grad_() for v in _views(4, [28, 28, 12])]
    z = method.embed_views(views, backbone)
    assert z.shape == (4, 3, 32)
    z.pow(2).sum().backward()
    assert proj_calls == [12]
    for v in views:
        assert v.grad is not None and v.grad.abs().sum() > 0


@pytest.mark.parametrize(
    "arch,extra,sizes",
    [("small_cnn", {}, [28, 28, 12]), ("resnet18", {}, [32, 32, 16]), ("vit_tiny", {"vit_tiny": ViTOptions(img_size=32)}, [32, 32, 16])],
)
def test_every_parameter_gets_a_gradient(arch: str, extra: dict, sizes: list[int]) -> None:
    """DDP (find_unused_parameters=False) and DeepSpeed fail on parameters that never receive a gradient."""
    backbone, method = _build(arch, **extra)
    loss, _ = method(_views(2, sizes), backbone)
    loss.backward()
    params = [*backbone.named_parameters(), *method.named_parameters()]
    assert params and not [n for n, p in params if p.grad is None]


def test_bad_views_are_rejected() -> None:
    backbone, method = _build("small_cnn")
    with pytest.raises(ValueError, match="non-empty list"):
        method.embed_views([], backbone)
    with pytest.raises(ValueError, match="non-empty list"):
        method.embed_views(torch.randn(2, 3, 28, 28), backbone)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="same B and C"):
        method.embed_views([torch.randn(2, 3, 28, 28), torch.randn(2, 3, 28, 28), torch.randn(3, 3, 12, 12)], backbone)
