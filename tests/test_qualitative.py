"""Qualitative analyses (eval.qualitative): hypercolumn PCA, Grad-CAM, feature inversion, ViT attention, and
the PNG grids of ``render_qualitative``. Tiny randomly initialised models on CPU."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from PIL import Image
from sklearn.decomposition import PCA

from hypersolid_scale.eval.qualitative import (
    ANALYSES,
    gradcam,
    hypercolumn_pca,
    hypercolumns,
    invert_features,
    render_qualitative,
    vit_attention,
)
from hypersolid_scale.eval.qualitative._common import pca_rgb, stretch_display, to_display
from hypersolid_scale.eval.qualitative.gradcam import own_targets
from hypersolid_scale.eval.qualitative.inversion import canvas_sizes, total_variation
from hypersolid_scale.eval.skips import NotApplicable, SkipLog, SkippedWarning
from hypersolid_scale.models import (
    BackboneWithProjector,
    ModelConfig,
    Projector,
    SmallCNNOptions,
    ViTOptions,
    build_backbone,
)


def _model(arch: str, **kw: object) -> torch.nn.Module:
    """Evaluation's model of a Hypersolid run with a one-layer projector to 8 dimensions."""
    torch.manual_seed(0)
    backbone, dim = build_backbone(ModelConfig(arch=arch, **kw))  # type: ignore[arg-type]
    return BackboneWithProjector(backbone, dim, Projector(dim, 8, 8, 1)).eval()


@pytest.fixture(scope="module")
def cnn() -> torch.nn.Module:
    return _model("small_cnn", in_channels=1, small_cnn=SmallCNNOptions(width=4))


@pytest.fixture(scope="module")
def resnet() -> torch.nn.Module:
    return _model("resnet18")  # torchvision stem: a 64 px input leaves a 2x2 map at layer4


@pytest.fixture(scope="module")
def vit() -> torch.nn.Module:
    return _model("vit_tiny", vit_tiny=ViTOptions(img_size=32, patch_size=8))  # 4x4 patches


def _images(n: int, c: int, size: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, c, size, size, generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------------------------------------------
# hypercolumns
# --------------------------------------------------------------------------------------------------------------

def test_hypercolumn_pca_shape_range_and_determinism(resnet: torch.nn.Module, cnn: torch.nn.Module) -> None:
    x = _images(2, 3, 32)
    cols = hypercolumns(resnet, x)
    assert cols.shape == (2, 64 + 128 + 256 + 512, 32, 32)  # layer1..layer4 of ResNet-18
    for model, imgs in ((resnet, x), (cnn, _images(3, 1, 28))):
        rgb = hypercolumn_pca(model, imgs)
        assert rgb.shape == (imgs.shape[0], *imgs.shape[-2:], 3)
        assert float(rgb.min()) >= 0.0 and float(rgb.max()) <= 1.0
        # each image's components are scaled to span [0, 1]
        assert torch.allclose(rgb.amax(dim=(1, 2)), torch.ones(imgs.shape[0], 3))
        assert torch.equal(rgb, hypercolumn_pca(model, imgs))
        joint = hypercolumn_pca(model, imgs, joint=True)
        assert joint.shape == rgb.shape and not torch.equal(joint, rgb)


def test_pca_rgb_matches_sklearn() -> None:
    rng = np.random.default_rng(0)
    feats = rng.normal(size=(200, 12)) * np.linspace(5.0, 0.5, 12)  # distinct variances: unique components
    ours = pca_rgb(torch.from_numpy(feats)).numpy()
    ref = PCA(n_components=3, svd_solver="full").fit_transform(feats)
    for k in range(3):
        col = ref[:, k]
        scaled = (col - col.min()) / (col.max() - col.min())
        flipped = (col.max() - col) / (col.max() - col.min())
        assert min(np.abs(ours[:, k] - scaled).max(), np.abs(ours[:, k] - flipped).max()) < 1e-5
    # Sign convention fixed by the loadings (largest-magnitude loading positive), not by the solver: negated
    # data has the same components, so every projection and hence every colour channel is inverted.
    assert np.allclose(pca_rgb(torch.from_numpy(-feats)).numpy(), 1.0 - ours, atol=1e-5)


def test_pca_rgb_grouped_scaling() -> None:
    feats = torch.randn(2 * 50, 6, generator=torch.Generator().manual_seed(0))
    rgb = pca_rgb(feats, groups=2).view(2, 50, 3)
    assert torch.allclose(rgb.amin(dim=1), torch.zeros(2, 3), atol=1e-6)
    assert torch.allclose(rgb.amax(dim=1), torch.ones(2, 3), atol=1e-6)


def test_display_scalings() -> None:
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    shown = to_display(x, (0.5, 0.4, 0.3), (0.2, 0.2, 0.2))
    assert shown.shape == (2, 8, 8, 3)
    assert np.allclose(shown, np.clip(x.permute(0, 2, 3, 1).numpy() * 0.2 + [0.5, 0.4, 0.3], 0, 1), atol=1e-6)
    x[0, 0, 0, 0] = 100.0  # one extreme pixel does not set the scale of the stretched display
    stretched = stretch_display(x)
    assert stretched.min() == 0.0 and stretched.max() == 1.0
    assert 0.3 < float(np.median(stretched[0])) < 0.7


def test_conv_analyses_do_not_apply_to_vit(vit: torch.nn.Module) -> None:
    x = _images(1, 3, 32)
    with pytest.raises(NotApplicable, match="ViT"):
        hypercolumn_pca(vit, x)
    with pytest.raises(NotApplicable, match="ViT"):
        gradcam(vit, x)


# --------------------------------------------------------------------------------------------------------------
# Grad-CAM
# --------------------------------------------------------------------------------------------------------------

def _gradcam_one(model: torch.nn.Module, image: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Reference: textbook Grad-CAM of one image on layer4, via retain_grad and backward."""
    seen = {}
    handle = model.backbone.layer4.register_forward_hook(lambda _m, _i, out: seen.setdefault("a", out))
    try:
        z = model.backbone(image[None])
    finally:
        handle.remove()
    act = seen["a"]
    act.retain_grad()
    (z[0] @ (target / target.norm())).backward()
    model.zero_grad(set_to_none=True)
    cam = torch.relu((act.grad.mean(dim=(2, 3), keepdim=True) * act).sum(dim=1, keepdim=True))
    cam = torch.nn.functional.interpolate(cam, size=image.shape[-2:], mode="bilinear", align_corners=False)[0, 0]
    return cam / cam.max() if cam.max() > 0 else cam


def test_gradcam_matches_single_image_reference(resnet: torch.nn.Module) -> None:
    x = _images(3, 3, 64)
    targets = own_targets(resnet, x)
    maps = gradcam(resnet, x)
    assert maps.shape == (3, 64, 64)
    for i in range(3):
        assert torch.allclose(maps[i], _gradcam_one(resnet, x[i], targets[i]).detach(), atol=1e-5)
    assert all(p.grad is None for p in resnet.parameters())  # the analysis leaves no parameter gradients


def test_gradcam_range_determinism_and_target(resnet: torch.nn.Module, cnn: torch.nn.Module) -> None:
    for model, x in ((resnet, _images(2, 3, 64)), (cnn, _images(2, 1, 28))):
        for stages in ("last", "all"):
            maps = gradcam(model, x, stages=stages)
            assert float(maps.min()) >= 0.0
            # normalised: the own-target score has a non-zero gradient, each map peaks at exactly 1
            assert torch.allclose(maps.flatten(1).amax(dim=1), torch.ones(2))
            assert torch.equal(maps, gradcam(model, x, stages=stages))
        other = own_targets(model, x).flip(0)  # image 0 explained towards image 1's embedding and vice versa
        assert not torch.allclose(gradcam(model, x, targets=other), gradcam(model, x), atol=1e-3)
        assert not torch.allclose(gradcam(model, x, stages="all"), gradcam(model, x), atol=1e-3)


def test_gradcam_restores_mode_and_checks_input(cnn: torch.nn.Module) -> None:
    cnn.train()
    try:
        gradcam(cnn, _images(2, 1, 28))
        assert cnn.training
    finally:
        cnn.eval()
    with pytest.raises(ValueError, match="stages"):
        gradcam(cnn, _images(1, 1, 28), stages="first")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="one \\(N, F\\) embedding per image"):
        gradcam(cnn, _images(2, 1, 28), targets=torch.randn(3, 16))
    with pytest.raises(ValueError, match=r"\(N, C, H, W\)"):
        gradcam(cnn, torch.randn(1, 28, 28))


# --------------------------------------------------------------------------------------------------------------
# feature inversion
# --------------------------------------------------------------------------------------------------------------

def test_canvas_schedule_is_the_papers() -> None:
    assert canvas_sizes((224, 224), (0.125, 0.25, 0.5, 0.75, 1.0)) == [(28, 28), (56, 56), (112, 112),
                                                                        (168, 168), (224, 224)]
    assert canvas_sizes((224, 224), (0.125, 0.75), multiple=16) == [(32, 32), (176, 176)]  # ViT patches
    assert canvas_sizes((28, 28), (0.125, 1.0)) == [(4, 4), (28, 28)]


def test_total_variation_is_the_formula() -> None:
    x = torch.randn(2, 3, 5, 4, generator=torch.Generator().manual_seed(0))
    ref = torch.zeros(2)
    for n in range(2):
        for c in range(3):
            for i in range(5):
                for j in range(4):
                    if i + 1 < 5:
                        ref[n] += (x[n, c, i + 1, j] - x[n, c, i, j]).abs()
                    if j + 1 < 4:
                        ref[n] += (x[n, c, i, j + 1] - x[n, c, i, j]).abs()
    assert torch.allclose(total_variation(x, "sum"), ref, atol=1e-5)
    count_h, count_w = 3 * 4 * 4, 3 * 5 * 3
    dh = (x[:, :, 1:] - x[:, :, :-1]).abs().flatten(1).sum(1)
    assert torch.allclose(total_variation(x, "mean"), dh / count_h + (ref - dh) / count_w, atol=1e-5)


def _signed_net() -> torch.nn.Module:
    """A random net whose embeddings of different images point in clearly different directions (signed
    features; a random ReLU/BN backbone maps every image to nearly the same direction), so that the content
    term starts far from 0 and its decrease is measurable."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1, bias=False), torch.nn.Tanh(),
        torch.nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False),
        torch.nn.Tanh(), torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten(),
    ).eval()


def test_inversion_objective_decreases(cnn: torch.nn.Module) -> None:
    x = _images(2, 1, 28)
    inv = invert_features(_signed_net(), x, steps_per_scale=80, scales=(0.5, 1.0))
    assert len(inv.objective) == len(inv.content) == 160
    assert np.mean(inv.content[:5]) > 0.5  # the canvas starts far from the target
    # Jitter and the periodic blur make single steps noisy; averages over 10 steps fall clearly (a random
    # net is not shift-invariant, so with jitter on it never matches its target closely).
    assert np.mean(inv.objective[-10:]) < 0.8 * np.mean(inv.objective[:10])
    assert np.mean(inv.content[-10:]) < 0.85 * np.mean(inv.content[:10])
    assert inv.images.shape == x.shape  # one channel in, one-channel canvas out
    # the same on a model of this project (whose random embeddings start close: only the trend is checked)
    inv = invert_features(cnn, x, steps_per_scale=40, scales=(1.0,))
    assert np.mean(inv.objective[-10:]) < np.mean(inv.objective[:10])


def test_inversion_multiscale_seed_and_size(resnet: torch.nn.Module, cnn: torch.nn.Module) -> None:
    x = _images(2, 1, 28)
    runs = [invert_features(cnn, x, steps_per_scale=2, seed=s) for s in (0, 0, 1)]
    assert runs[0].sizes == [(4, 4), (7, 7), (14, 14), (21, 21), (28, 28)]
    assert len(runs[0].objective) == 5 * 2
    assert torch.equal(runs[0].images, runs[1].images) and runs[0].objective == runs[1].objective
    assert not torch.equal(runs[0].images, runs[2].images)
    big = invert_features(resnet, _images(1, 3, 32), size=24, steps_per_scale=2, scales=(0.5, 1.0))
    assert big.images.shape == (1, 3, 24, 24) and big.sizes == [(12, 12), (24, 24)]


def test_inversion_on_vit_keeps_whole_patches(vit: torch.nn.Module) -> None:
    inv = invert_features(vit, _images(1, 3, 32), steps_per_scale=1, scales=(0.125, 0.5, 1.0))
    assert inv.sizes == [(8, 8), (16, 16), (32, 32)]


@pytest.mark.parametrize("kwargs, match", [
    (dict(steps_per_scale=0), "steps_per_scale"),
    (dict(scales=(1.0, 0.5)), "increasing"),
    (dict(scales=(0.0, 1.0)), "increasing"),
    (dict(lr=0.0), "lr"),
    (dict(blur_kernel=4), "odd"),
    (dict(tv_reduction="max"), "tv_reduction"),
])
def test_inversion_rejects_bad_settings(cnn: torch.nn.Module, kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        invert_features(cnn, _images(1, 1, 28), **kwargs)


# --------------------------------------------------------------------------------------------------------------
# ViT attention
# --------------------------------------------------------------------------------------------------------------

def test_attention_matches_timm_weights(vit: torch.nn.Module) -> None:
    x = _images(2, 3, 32)
    maps = vit_attention(vit, x)
    assert maps.cls_attention.shape == (2, 3, 4, 4) and maps.grid == (4, 4)  # ViT-Tiny: 3 heads
    assert maps.patch_pca.shape == (2, 4, 4, 3)
    assert float(maps.patch_pca.min()) >= 0.0 and float(maps.patch_pca.max()) <= 1.0
    # Reference: timm's own (unfused) attention weights of the last block
    attn = vit.backbone.vit.blocks[-1].attn
    seen = {}
    fused = attn.fused_attn
    attn.fused_attn = False
    handle = attn.attn_drop.register_forward_hook(lambda _m, _i, out: seen.setdefault("w", out))
    try:
        with torch.no_grad():
            vit.backbone(x)
    finally:
        handle.remove()
        attn.fused_attn = fused
    prefix = vit.backbone.vit.num_prefix_tokens
    ref = seen["w"][:, :, 0, prefix:].reshape(2, 3, 4, 4)
    assert torch.allclose(maps.cls_attention, ref, atol=1e-5)
    assert torch.equal(maps.cls_attention, vit_attention(vit, x).cls_attention)


def test_attention_not_applicable_on_cnns(resnet: torch.nn.Module, cnn: torch.nn.Module) -> None:
    with pytest.raises(NotApplicable, match="ViT"):
        vit_attention(resnet, _images(1, 3, 64))
    with pytest.raises(NotApplicable, match="ViT"):
        vit_attention(cnn, _images(1, 1, 28))


def test_attention_rejects_partial_patches(vit: torch.nn.Module) -> None:
    with pytest.raises(ValueError, match="multiple of the ViT patch size"):
        vit_attention(vit, _images(1, 3, 30))


# --------------------------------------------------------------------------------------------------------------
# render_qualitative
# --------------------------------------------------------------------------------------------------------------

def _check_png(path) -> None:  # noqa: ANN001
    with Image.open(path) as img:
        assert img.format == "PNG" and img.size[0] > 50 and img.size[1] > 50


def test_render_resnet_writes_pngs_and_skips_attention(resnet: torch.nn.Module, tmp_path) -> None:  # noqa: ANN001
    skips = SkipLog()
    with pytest.warns(SkippedWarning, match="attention"):
        paths = render_qualitative(resnet, _images(2, 3, 32), [3, 7], tmp_path / "q", inversion_steps=1,
                                   skips=skips, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    assert set(paths) == {"hypercolumns", "gradcam", "inversion"}
    assert list(skips.reasons) == ["attention"] and "ViT" in skips.reasons["attention"]
    for name, path in paths.items():
        assert path == tmp_path / "q" / f"{name}.png"
        _check_png(path)


def test_render_grayscale_cnn_and_vit(cnn: torch.nn.Module, vit: torch.nn.Module, tmp_path) -> None:  # noqa: ANN001
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SkippedWarning)
        gray = render_qualitative(cnn, _images(2, 1, 28), None, tmp_path / "cnn", inversion_steps=1,
                                  class_names=["a", "b"])
        skips = SkipLog()
        v = render_qualitative(vit, _images(2, 3, 32), [0, 1], tmp_path / "vit", inversion_steps=1, skips=skips)
    assert set(gray) == {"hypercolumns", "gradcam", "inversion"}
    assert set(v) == {"inversion", "attention"} and set(skips.reasons) == {"hypercolumns", "gradcam"}
    for path in [*gray.values(), *v.values()]:
        _check_png(path)


def test_render_rejects_bad_arguments(cnn: torch.nn.Module, tmp_path) -> None:  # noqa: ANN001
    x = _images(2, 1, 28)
    with pytest.raises(ValueError, match="unknown qualitative analyses"):
        render_qualitative(cnn, x, None, tmp_path, analyses=["saliency"])
    with pytest.raises(ValueError, match="one label per image"):
        render_qualitative(cnn, x, [1], tmp_path, analyses=["gradcam"])
    with pytest.raises(ValueError, match="mean/std"):
        render_qualitative(cnn, x, None, tmp_path, analyses=["gradcam"], mean=(0.1, 0.2, 0.3), std=(1, 1, 1))
    assert set(ANALYSES) == {"hypercolumns", "gradcam", "inversion", "attention"}


# --------------------------------------------------------------------------------------------------------------
# CUDA: the same analyses on the device agree with the CPU
# --------------------------------------------------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_analyses_on_cuda_match_cpu(resnet: torch.nn.Module, vit: torch.nn.Module, tmp_path) -> None:  # noqa: ANN001
    import copy

    x = _images(2, 3, 64)
    gpu = copy.deepcopy(resnet).cuda()
    cam_cpu, cam_gpu = gradcam(resnet, x), gradcam(gpu, x.cuda()).cpu()
    assert torch.allclose(cam_cpu, cam_gpu, atol=1e-3)
    rgb_cpu, rgb_gpu = hypercolumn_pca(resnet, x), hypercolumn_pca(gpu, x.cuda()).cpu()
    # PCA signs are fixed by convention, so the colours agree up to float differences
    assert (rgb_cpu - rgb_gpu).abs().mean() < 1e-2
    vgpu = copy.deepcopy(vit).cuda()
    att_cpu, att_gpu = vit_attention(vit, _images(2, 3, 32)), vit_attention(vgpu, _images(2, 3, 32).cuda())
    assert torch.allclose(att_cpu.cls_attention, att_gpu.cls_attention.cpu(), atol=1e-4)
    paths = render_qualitative(gpu, x, [0, 1], tmp_path / "q", inversion_steps=2, device="cuda",
                               analyses=["hypercolumns", "gradcam", "inversion"])
    assert set(paths) == {"hypercolumns", "gradcam", "inversion"}
