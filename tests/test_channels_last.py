"""model.channels_last: the run's weights and views in NHWC give the NCHW run's loss and gradients within float
rounding, for every backbone, through the trainer's own build and view hand-over."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import hypersolid_scale.training.trainer as train_mod
from hypersolid_scale.config.schema import load_config
from hypersolid_scale.distributed import WorldInfo
from hypersolid_scale.models.backbones import backbone_names

TINY = ["data.dataset=digits", "model.in_channels=1", "model.small_cnn.width=4", "method.hypersolid.num_layers=2",
        "method.hypersolid.hidden_dim=32", "method.hypersolid.out_dim=32", "data.num_local_views=2", "data.batch_size_per_gpu=4",
        "data.num_workers=0", "progress=false", "eval.every_n_epochs=0", "data.max_pretrain_samples=16",
        "dist.device=cpu", "dist.bf16=false"]
ARCH = {"resnet18": ["model.small_stem=true"], "resnet50": ["model.small_stem=true"],
        "vit_tiny": ["model.vit_tiny.img_size=16", "model.vit_tiny.patch_size=4", "data.global_crop_size=16", "data.local_crop_size=8"]}


def loss_and_grads(tmp_path: Path, arch: str, channels_last: str) -> tuple[float, dict[str, torch.Tensor], train_mod.Run]:
    cfg = load_config(None, [*TINY, *ARCH.get(arch, []), f"model.arch={arch}", f"model.channels_last={channels_last}",
                             f"run_dir={tmp_path / channels_last}"])
    torch.manual_seed(0)
    run = train_mod.build(cfg, WorldInfo(0, 1, 0, "single"), torch.device("cpu"))
    run.loader.set_epoch(0)
    views, _ = next(iter(run.loader))
    # In float64, where float rounding is far below any real difference: in float32 the loss's hard threshold
    # (cosine > alpha) turns rounding-level changes into pairs that switch sides, on these tiny images.
    run.trained.double()
    views = [v.double().to("cpu", memory_format=run.memory_format) for v in views]  # as train_loop hands them
    loss, _ = run.engine.wrapped(views)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in run.trained.named_parameters() if p.grad is not None}
    return float(loss), grads, run


@pytest.mark.parametrize("arch", backbone_names())
def test_channels_last_gives_the_nchw_loss_and_gradients(tmp_path: Path, arch: str) -> None:
    ref_loss, ref, run = loss_and_grads(tmp_path, arch, "false")
    assert run.memory_format == torch.contiguous_format
    loss, got, run = loss_and_grads(tmp_path, arch, "true")
    assert run.memory_format == torch.channels_last
    convs = [m for m in run.backbone.modules() if isinstance(m, torch.nn.Conv2d)]
    assert convs and all(m.weight.is_contiguous(memory_format=torch.channels_last) for m in convs)
    assert loss == pytest.approx(ref_loss, rel=1e-10, abs=1e-12)
    assert got.keys() == ref.keys()
    total = torch.cat([g.flatten() for g in ref.values()]).norm()
    diff = torch.cat([(got[k] - ref[k]).flatten() for k in ref]).norm()
    assert float(diff) <= 1e-9 * float(total), (float(diff), float(total))  # float64 rounding, not a bug


def test_auto_is_on_for_convolutional_backbones_on_cuda_only() -> None:
    from hypersolid_scale.models import ModelConfig, ViTOptions, build_backbone
    from hypersolid_scale.training.run_builder import resolve_channels_last

    cnn, _ = build_backbone(ModelConfig(arch="small_cnn", in_channels=1))
    vit, _ = build_backbone(ModelConfig(arch="vit_tiny", vit_tiny=ViTOptions(img_size=16, patch_size=4)))
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert resolve_channels_last("auto", cnn, cuda) and not resolve_channels_last("auto", vit, cuda)
    assert not resolve_channels_last("auto", cnn, cpu)
    assert resolve_channels_last("true", vit, cpu) and not resolve_channels_last("false", cnn, cuda)
    with pytest.raises(ValueError, match="model.channels_last='yes' is not one of"):
        ModelConfig(channels_last="yes")
