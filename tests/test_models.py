"""Models: shapes per backbone, non-RGB inputs, Hypersolid's projector MLP, SyncBatchNorm conversion, and config validation.
(The multi-crop forward is the methods' own: tests/test_multicrop.py.)"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hypersolid_scale.config.schema import load_config
from hypersolid_scale.methods.hypersolid import HypersolidConfig
from hypersolid_scale.models import (
    BackboneWithProjector,
    ModelConfig,
    Projector,
    ViTOptions,
    backbone_names,
    build_backbone,
)
from hypersolid_scale.safety.errors import ConfigError


def build_model(cfg: ModelConfig, layers: int = 3) -> BackboneWithProjector:
    """The backbone of ``cfg`` with a small Hypersolid projector (hidden 64, D 32): evaluation's model of a
    Hypersolid run. The projector is small: it is not what most of these tests exercise."""
    backbone, dim = build_backbone(cfg)
    return BackboneWithProjector(backbone, dim, Projector(dim, 64, 32, layers))


def _views(batch: int, channels: int, sizes: list[int], seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, channels, s, s, generator=g) for s in sizes]


def _project(model: BackboneWithProjector, images: torch.Tensor) -> torch.Tensor:
    """Projector features (N, D) of one batch of images."""
    return model.projector(model.backbone(images))


# ---------------------------------------------------------------------------------------------------------------
# Shapes
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "arch,extra,feature_dim,sizes",
    [
        ("small_cnn", {}, 128, [28, 28, 12, 12]),
        ("resnet18", {"small_stem": True}, 512, [16, 8]),
        ("resnet18", {}, 512, [32, 32, 16]),
        ("resnet50", {}, 2048, [32, 32]),
        ("vit_tiny", {}, 192, [64, 64, 32]),  # 224/96 px: see the interpolation test
    ],
)
def test_output_shapes(arch: str, extra: dict, feature_dim: int, sizes: list[int]) -> None:
    torch.manual_seed(0)
    model = build_model(ModelConfig(arch=arch, **extra))
    assert model.feature_dim == feature_dim
    views = _views(2, 3, sizes)
    for v in views:
        out = _project(model, v)
        assert out.shape == (2, 32) and torch.isfinite(out).all()
    assert model.backbone(views[0]).shape == (2, feature_dim)
    assert model.embed(views[-1]).shape == (2, feature_dim)


def test_vit_interpolates_position_embeddings_for_local_crops() -> None:
    torch.manual_seed(0)
    model = build_model(ModelConfig(arch="vit_tiny")).eval()
    f224 = model.embed(torch.randn(2, 3, 224, 224))
    f96 = model.embed(torch.randn(2, 3, 96, 96))
    assert f224.shape == f96.shape == (2, 192)
    with pytest.raises(ValueError, match="multiple of model.vit_tiny.patch_size=16"):
        model.embed(torch.randn(1, 3, 50, 50))


def test_resnet_small_stem_keeps_resolution() -> None:
    """The small stem must skip the 4x early downsampling, so layer4 of a 32 px input is 4x4, not 1x1."""
    for small_stem, expected in ((True, 4), (False, 1)):
        model = build_model(ModelConfig(arch="resnet18", small_stem=small_stem)).eval()
        seen: list[torch.Size] = []
        model.backbone.layer4.register_forward_hook(lambda _m, _i, out: seen.append(out.shape))
        model.embed(torch.randn(1, 3, 32, 32))
        assert seen[0][-2:] == (expected, expected)


@pytest.mark.parametrize(
    "arch,extra,size",
    [("small_cnn", {}, 28), ("resnet18", {"small_stem": True}, 28), ("resnet18", {}, 32),
     ("vit_tiny", {"vit_tiny": ViTOptions(img_size=32)}, 32)],
)
def test_grayscale_inputs(arch: str, extra: dict, size: int) -> None:
    model = build_model(ModelConfig(arch=arch, in_channels=1, **extra))
    assert _project(model, _views(2, 1, [size])[0]).shape == (2, 32)
    with pytest.raises(RuntimeError):  # a 3-channel image must not be silently accepted by a 1-channel stem
        model.embed(torch.randn(2, 3, size, size))


def test_small_cnn_size_and_tiny_crops() -> None:
    model = build_model(ModelConfig(arch="small_cnn", in_channels=1))
    n_params = sum(p.numel() for p in model.backbone.parameters())
    assert 100_000 <= n_params <= 300_000
    # ceil-mode pooling: even a 4 px crop keeps a non-empty map through all three poolings.
    assert model.embed(torch.randn(2, 1, 4, 4)).shape == (2, 128)


# ---------------------------------------------------------------------------------------------------------------
# Projector
# ---------------------------------------------------------------------------------------------------------------

def test_projector_layers() -> None:
    for layers in (1, 2, 3):
        model = build_model(ModelConfig(arch="small_cnn"), layers)
        linears = [m for m in model.projector.modules() if isinstance(m, nn.Linear)]
        norms = [m for m in model.projector.modules() if isinstance(m, nn.BatchNorm1d)]
        assert len(linears) == layers and len(norms) == layers - 1
        assert linears[-1].out_features == 32


def test_sync_batchnorm_conversion() -> None:
    model = build_model(ModelConfig(arch="small_cnn"))
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    assert bns and all(isinstance(m, nn.SyncBatchNorm) for m in bns)
    assert any(isinstance(m, nn.SyncBatchNorm) for m in model.projector.modules())
    # Without a process group SyncBatchNorm behaves like BatchNorm, so the model still runs (train and eval).
    for images in _views(4, 3, [28, 12]):
        assert _project(model.train(), images).shape == _project(model.eval(), images).shape == (4, 32)


def test_state_dict_roundtrip() -> None:
    cfg = ModelConfig(arch="resnet18", in_channels=1)
    torch.manual_seed(0)
    a = build_model(cfg).eval()
    torch.manual_seed(1)
    b = build_model(cfg).eval()
    b.load_state_dict(a.state_dict())
    for images in _views(2, 1, [32, 16]):
        torch.testing.assert_close(_project(a, images), _project(b, images))


# ---------------------------------------------------------------------------------------------------------------
# Config validation
# ---------------------------------------------------------------------------------------------------------------

def test_defaults() -> None:
    cfg = ModelConfig()
    assert cfg.arch == "small_cnn" and backbone_names()[0] == cfg.arch  # the default is listed first
    head = HypersolidConfig()  # the paper's D = 1024; depth and width ours (methods/hypersolid.py)
    assert (head.num_layers, head.hidden_dim, head.out_dim) == (3, 2048, 1024)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"arch": "resnet34"}, r"model.arch='resnet34' is not a known backbone; choose one of: small_cnn \| resnet18"),
        ({"in_channels": 0}, "model.in_channels=0 must be a positive integer"),
        ({"in_channels": True}, "model.in_channels=True"),
        ({"arch": "vit_tiny", "small_stem": True}, "small_stem=true only applies to"),
        ({"arch": "small_cnn", "small_stem": True}, "small_stem=true only applies to"),
        ({"arch": "vit_tiny", "vit_tiny": ViTOptions(img_size=100)}, "img_size=100 must be a multiple of model.vit_tiny.patch_size=16"),
    ],
)
def test_bad_config(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ModelConfig(**kwargs)


@pytest.mark.parametrize("override, match", [
    ("out_dim=-4", "method.hypersolid.out_dim=-4 is not allowed; it must be a positive integer"),
    ("num_layers=0", "method.hypersolid.num_layers=0 is not allowed"),
    ("hidden_dim=2.5", "'method.hypersolid.hidden_dim' .*'2.5'"),
])
def test_bad_projector_shape_names_the_methods_key(override: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(None, [f"method.hypersolid.{override}"])


def test_config_through_omegaconf_overrides() -> None:
    """The trainer builds configs as OmegaConf structured configs; instantiating one must validate."""
    from omegaconf import OmegaConf

    base = OmegaConf.structured(ModelConfig)
    good = OmegaConf.to_object(OmegaConf.merge(base, OmegaConf.from_dotlist(["arch=resnet18", "small_stem=true"])))
    assert isinstance(good, ModelConfig) and good.arch == "resnet18" and good.small_stem
    with pytest.raises(ValueError, match="choose one of"):
        OmegaConf.to_object(OmegaConf.merge(base, OmegaConf.from_dotlist(["arch=vgg16"])))


def test_build_backbone_revalidates_mutated_config() -> None:
    cfg = ModelConfig()
    cfg.arch = "alexnet"  # e.g. set by an override after construction
    with pytest.raises(ValueError, match="not a known backbone"):
        build_backbone(cfg)
