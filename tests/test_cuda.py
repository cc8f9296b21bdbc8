"""CUDA-only checks (``pytest -m cuda``): mixed precision, backends, channels_last, compile, SyncBatchNorm,
DeepSpeed and the tensor augmentations on the device. Each one is small (seconds) and skips without a GPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _net import free_port

from hypersolid_scale.losses import HypersolidLoss
from hypersolid_scale.methods import MethodModel
from hypersolid_scale.methods.hypersolid import Hypersolid, HypersolidConfig
from hypersolid_scale.models import ModelConfig, build_backbone

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

DEV = torch.device("cuda")


def views_for(batch: int, sizes: list[int], seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator(device=DEV).manual_seed(seed)
    return [torch.randn(batch, 3, s, s, generator=g, device=DEV) for s in sizes]


def small_model(arch: str = "small_cnn", **kw) -> torch.nn.Module:
    """A Hypersolid run's model: the backbone and the method (its projector), as the trainer builds it."""
    torch.manual_seed(0)
    backbone, dim = build_backbone(ModelConfig(arch=arch, in_channels=3, **kw))
    return MethodModel(backbone, dim, Hypersolid(dim, HypersolidConfig(hidden_dim=256, out_dim=128))).to(DEV)


def project(model: torch.nn.Module, views: list[torch.Tensor]) -> torch.Tensor:
    """Projector outputs (B, V, D): the method's own embed, through the module's forward (compiled or not)."""
    return model(views, embed=True)["z"][0]


def grads_of(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.flatten().float() for p in model.parameters() if p.grad is not None])


def test_bf16_autocast_matches_fp32():
    model, views = small_model(), views_for(16, [32, 32, 16, 16])
    loss_fn = HypersolidLoss(alpha=0.5)
    out = {}
    for bf16 in (False, True):
        model.zero_grad(set_to_none=True)
        with torch.autocast(DEV.type, dtype=torch.bfloat16, enabled=bf16):
            feats = project(model, views)
        assert feats.dtype == (torch.bfloat16 if bf16 else torch.float32)
        loss = loss_fn(feats)
        assert loss.dtype == torch.float32  # the loss never rounds its value to bf16
        loss.backward()
        out[bf16] = (float(loss.detach()), grads_of(model))
    assert out[True][0] == pytest.approx(out[False][0], rel=2e-2)
    assert F.cosine_similarity(out[True][1], out[False][1], dim=0) > 0.98


def test_dense_tiled_neighbors_agree_on_cuda():
    g = torch.Generator(device=DEV).manual_seed(1)
    base = torch.randn(64, 1, 32, generator=g, device=DEV)
    feats = base + 0.6 * torch.randn(64, 4, 32, generator=g, device=DEV)  # some pairs inside alpha, most not
    results = {}
    backends = [("dense", {}), ("tiled", {"tile_size": 48}), ("neighbors", {"index": "flat", "k": 16})]
    try:
        HypersolidLoss(backend="auto")
        backends.append(("auto", {}))  # switches between exact backends: must agree too
    except ValueError:
        pass
    for backend, opts in backends:
        f = feats.clone().requires_grad_(True)
        fn = HypersolidLoss(alpha=0.5, backend=backend, **opts)
        loss = fn(f)
        loss.backward()
        results[backend] = (float(loss), f.grad, fn.stats["active_pairs"])
    dense = results["dense"]
    assert dense[2] > 0, "the test data must have active pairs, or it checks nothing"
    for backend in set(results) - {"dense"}:
        value, grad, active = results[backend]
        assert value == pytest.approx(dense[0], rel=1e-5, abs=1e-6), backend
        torch.testing.assert_close(grad, dense[1], rtol=1e-4, atol=1e-6, msg=backend)
        assert active == dense[2]


def test_channels_last_step_runs_and_matches_contiguous():
    model = small_model("resnet18", small_stem=True)
    model_cl = small_model("resnet18", small_stem=True).to(memory_format=torch.channels_last)
    views = views_for(8, [32, 32, 16, 16])
    loss_fn = HypersolidLoss()
    opt = torch.optim.AdamW(model_cl.parameters(), lr=1e-3)
    before = [p.detach().clone() for p in model_cl.parameters()]
    losses = []
    for m, vs in ((model, views), (model_cl, [v.contiguous(memory_format=torch.channels_last) for v in views])):
        loss = loss_fn(project(m, vs))
        loss.backward()
        losses.append(float(loss))
    opt.step()
    assert all(torch.isfinite(p).all() for p in model_cl.parameters())
    assert any(not torch.equal(a, p) for a, p in zip(before, model_cl.parameters()))
    assert losses[1] == pytest.approx(losses[0], rel=1e-3)


def test_torch_compile_matches_eager():
    model, views = small_model(), views_for(8, [32, 32, 16, 16])
    loss_fn = HypersolidLoss(alpha=0.5)
    eager = float(loss_fn(project(model, views)))
    compiled = torch.compile(model)
    try:
        value = float(loss_fn(project(compiled, views)))
    finally:
        torch._dynamo.reset()
    assert value == pytest.approx(eager, rel=1e-3, abs=1e-5)



def test_sync_batchnorm_on_one_rank_nccl_group():
    import torch.distributed as dist

    assert not dist.is_initialized()
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            device_id=torch.device("cuda", torch.cuda.current_device()))
    try:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(small_model("resnet18", small_stem=True))
        assert any(isinstance(m, torch.nn.SyncBatchNorm) for m in model.modules())
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        loss = HypersolidLoss()(project(model, views_for(8, [32, 32, 16, 16])))
        loss.backward()
        opt.step()
        assert torch.isfinite(loss)
        assert all(torch.isfinite(p).all() for p in model.parameters())
    finally:
        dist.destroy_process_group()


def test_deepspeed_zero2_one_rank_step():
    pytest.importorskip("deepspeed")
    from hypersolid_scale.distributed import build_engine, cleanup

    model = small_model()
    try:
        engine = build_engine(model, lambda p: torch.optim.AdamW(p, lr=1e-3), engine="deepspeed", device=DEV,
                              bf16=True, grad_clip=0.0, zero_stage=2, batch_size_per_gpu=8)
        before = [p.detach().clone() for p in engine.model.parameters()]
        seen: list[bool] = []
        hook = engine.model.backbone.register_forward_pre_hook(
            lambda *_: seen.append(torch.is_autocast_enabled("cuda")))
        with engine.autocast():  # the trainer's step
            loss, _ = engine.wrapped(views_for(8, [32, 32, 16, 16]))
        hook.remove()
        # DeepSpeed switches an outside autocast off inside its engine unless its config enables its own.
        assert seen and all(seen), "bf16 autocast did not reach the model inside the DeepSpeed engine"
        engine.backward(loss)
        engine.step()
        assert torch.isfinite(loss)
        assert any(not torch.equal(a, p.detach()) for a, p in zip(before, engine.model.parameters()))
    finally:
        cleanup()


def test_tensor_multicrop_cuda_matches_cpu():
    from hypersolid_scale.data.augment.presets import PRESETS
    from hypersolid_scale.data.augment.tensor_aug import TensorMultiCrop

    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (16, 3, 40, 40), dtype=torch.uint8, generator=g)
    indices = torch.arange(100, 116)
    preset = PRESETS["cifar10"]
    cpu = TensorMultiCrop(preset, "cpu", seed=3)(images, indices, 2)
    gpu = TensorMultiCrop(preset, DEV, seed=3)(images.to(DEV), indices.to(DEV), 2)
    assert len(cpu) == len(gpu) == preset.num_views
    for a, b in zip(cpu, gpu):
        assert b.device.type == "cuda" and a.shape == b.shape
        diff = (a - b.cpu()).abs()
        # Same random decisions; only float rounding of the resampling and colour maths may differ.
        assert diff.mean() < 1e-3 and diff.max() < 5e-2


def test_tensor_multicrop_inside_autocast_stays_float32():
    from hypersolid_scale.data.augment.presets import PRESETS
    from hypersolid_scale.data.augment.tensor_aug import TensorMultiCrop

    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (8, 3, 64, 64), dtype=torch.uint8, generator=g).to(DEV)
    indices = torch.arange(8, device=DEV)
    multicrop = TensorMultiCrop(PRESETS["imagenet"], DEV, seed=1)
    plain = multicrop(images, indices, 0)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        inside = multicrop(images, indices, 0)
    for a, b in zip(plain, inside):
        assert b.dtype == torch.float32 and torch.equal(a, b)
