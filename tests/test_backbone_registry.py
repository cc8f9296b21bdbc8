"""The backbone registry: a backbone is one registration (builder + its own settings), found by name everywhere
model.arch is read; a backbone registered at run time trains like the built-in ones."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from hypersolid_scale.methods.hypersolid import Hypersolid, HypersolidConfig
from hypersolid_scale.models import (
    ModelConfig,
    backbone_names,
    build_backbone,
    get_backbone,
    register_backbone,
    unregister_backbone,
)
from hypersolid_scale.safety.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


class TinyConv(nn.Module):
    """Conv-BN-ReLU, global average pool: (N, C, H, W) -> (N, width)."""

    def __init__(self, in_channels: int, width: int = 8) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(in_channels, width, 3, padding=1, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.feature_dim = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def build_tiny_conv(cfg: ModelConfig) -> tuple[nn.Module, int]:
    net = TinyConv(cfg.in_channels)
    return net, net.feature_dim


@contextlib.contextmanager
def registered(name: str, build=build_tiny_conv, **options) -> Iterator[str]:
    """``name`` registered for the block only, so no other test sees it."""
    register_backbone(name, **options)(build)
    try:
        yield name
    finally:
        unregister_backbone(name)


@pytest.fixture
def tiny_conv() -> Iterator[str]:
    with registered("tiny_conv") as name:
        yield name
    assert name not in backbone_names()


def test_builtin_backbones_are_registered_with_their_settings() -> None:
    names = backbone_names()
    assert names[0] == "small_cnn" == ModelConfig().arch  # the default first, then the registry's order
    assert list(names) == sorted(names, key=lambda n: (get_backbone(n).order, n))
    # every module of the package registers at least one backbone
    modules = {p.stem for p in (ROOT / "hypersolid_scale" / "models" / "backbones").glob("[!_]*.py")}
    assert modules == {get_backbone(n).build.__module__.rsplit(".", 1)[1] for n in names}
    assert {"resnet18", "resnet50"} <= {n for n in names if get_backbone(n).small_stem}
    assert get_backbone("vit_tiny").check is not None and get_backbone("small_cnn").check is None


def test_a_backbone_registered_at_run_time_trains_one_step(tiny_conv: str) -> None:
    assert tiny_conv in backbone_names()
    torch.manual_seed(0)
    backbone, feature_dim = build_backbone(ModelConfig(arch=tiny_conv))
    assert isinstance(backbone, TinyConv) and feature_dim == 8
    method = Hypersolid(feature_dim, HypersolidConfig(hidden_dim=32, out_dim=16, alpha=0.3, norm_weight=1e-3))
    model = nn.ModuleList([backbone, method])
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    g = torch.Generator().manual_seed(1)
    views = [torch.randn(8, 3, s, s, generator=g) for s in (16, 16, 8, 8)]  # 2 global + 2 local crops
    out = method.embed_views(views, backbone)
    assert out.shape == (8, 4, 16)
    loss, _ = method.loss({"z": [out]})
    assert torch.isfinite(loss)
    opt.zero_grad()
    loss.backward()
    opt.step()
    unchanged = [n for n, p in model.named_parameters() if torch.equal(p, before[n])]
    assert not unchanged, f"parameters the step did not change: {unchanged}"


def test_unknown_arch_lists_the_registered_names(tiny_conv: str) -> None:
    with pytest.raises(ConfigError, match=r"model.arch='resnet34' is not a known backbone; choose one of") as err:
        ModelConfig(arch="resnet34")
    listed = str(err.value).split("choose one of: ")[1].split(" (")[0].split(" | ")
    assert listed == list(backbone_names()) and "tiny_conv" in listed
    cfg = ModelConfig()
    cfg.arch = "nope"  # e.g. set by an override after construction
    with pytest.raises(ConfigError, match=r"'nope' is not a known backbone; choose one of: small_cnn \| .*"
                                          r"a new backbone is a module in hypersolid_scale/models/backbones/"):
        build_backbone(cfg)


def test_the_registration_decides_small_stem_and_extra_checks() -> None:
    def needs_grayscale(cfg: ModelConfig) -> None:
        if cfg.in_channels != 1:
            raise ValueError(f"model.in_channels={cfg.in_channels} must be 1 for gray_conv")

    with pytest.raises(ValueError, match=r"small_stem=true only applies to \['resnet18', 'resnet50'\], not "
                                         r"arch='small_cnn'"):
        ModelConfig(arch="small_cnn", small_stem=True)
    with registered("gray_conv", small_stem=True, check=needs_grayscale):
        assert ModelConfig(arch="gray_conv", in_channels=1, small_stem=True).small_stem
        with pytest.raises(ValueError, match="must be 1 for gray_conv"):
            ModelConfig(arch="gray_conv", in_channels=3)
        with pytest.raises(ValueError, match=r"only applies to \['gray_conv', 'resnet18', 'resnet50'\]"):
            ModelConfig(arch="vit_tiny", small_stem=True)
    with pytest.raises(ValueError, match="'gray_conv' is not a known backbone"):
        ModelConfig(arch="gray_conv", in_channels=1)


def test_a_name_is_registered_once() -> None:
    with pytest.raises(ConfigError, match="two backbones are named 'resnet18'.*registered twice"):
        register_backbone("resnet18")(build_tiny_conv)
    with pytest.raises(ConfigError, match="backbone name '' .* is not a non-empty name"):
        register_backbone("")(build_tiny_conv)
    assert get_backbone("resnet18").build is not build_tiny_conv


def test_registering_first_keeps_the_builtins_and_validation_stays_cheap() -> None:
    """A fresh process: a registration before the first look-up must not hide the package's modules, and
    validating configs of every arch imports neither torchvision nor timm (they load inside the builders)."""
    code = (
        "import sys\n"
        "from hypersolid_scale.models.backbones import backbone_names, register_backbone\n"
        "register_backbone('early')(lambda cfg: None)\n"
        "from hypersolid_scale.models import ModelConfig\n"
        "for arch in ('small_cnn', 'resnet18', 'resnet50', 'vit_tiny'):\n"
        "    ModelConfig(arch=arch)\n"
        "print(backbone_names(), 'torchvision' in sys.modules, 'timm' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.split("\n")[0] == "('small_cnn', 'early', 'resnet18', 'resnet50', 'vit_tiny') False False"
