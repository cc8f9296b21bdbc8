"""The baselines on a GPU (``pytest -m cuda``): the loss and gradients on CUDA in float32 equal the CPU's, the
bf16 autocast the trainer uses stays close to them, and the momentum teachers follow the student alike."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_methods import build, make_views

from hypersolid_scale.methods import method_names

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
              pytest.mark.filterwarnings("ignore:.*weight_norm.*:FutureWarning")]

METHODS = method_names()

BASELINES = [m for m in METHODS if m != "hypersolid"]


def _step(backbone, method, device: str, bf16: bool) -> tuple[float, torch.Tensor]:
    """One loss and backward on ``device``; (loss, the backbone's flattened gradient)."""
    backbone, method = backbone.to(device), method.to(device)
    views = [v.to(device) for v in make_views(0)]
    with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=bf16):
        loss, _ = method(views, backbone)
    loss.float().backward()
    grad = torch.cat([p.grad.flatten().float().cpu() for p in backbone.parameters()])
    return loss.detach().float().item(), grad


@pytest.mark.parametrize("name", BASELINES)
def test_cuda_float32_equals_the_cpu_and_bf16_stays_close(name, monkeypatch):
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    # build() is seeded: each call makes the same networks (DINO's weight-normed head cannot be deep-copied).
    cpu_loss, cpu_grad = _step(*build(name), "cpu", bf16=False)
    gpu_loss, gpu_grad = _step(*build(name), "cuda", bf16=False)
    assert gpu_loss == pytest.approx(cpu_loss, rel=1e-4, abs=1e-5)
    # Absolute tolerance on the gradient's scale (Barlow Twins' reach 75): only summation order differs.
    torch.testing.assert_close(gpu_grad, cpu_grad, rtol=1e-3, atol=1e-5 * float(cpu_grad.abs().max()))
    bf_loss, bf_grad = _step(*build(name), "cuda", bf16=True)
    assert bf_loss == pytest.approx(cpu_loss, rel=5e-2, abs=5e-3), (bf_loss, cpu_loss)
    # bf16 rounds the projections: BYOL's small cosine loss moves most (0.95 on the CPU), a wrong path gives ~0
    assert F.cosine_similarity(bf_grad, cpu_grad, dim=0) > 0.9


@pytest.mark.parametrize("name", ["byol", "dino"])
def test_the_momentum_teacher_moves_alike_on_cuda(name):
    states = []
    for device in ("cpu", "cuda"):
        backbone, method = build(name)
        backbone, method = backbone.to(device), method.to(device)
        opt = torch.optim.SGD([p for p in [*backbone.parameters(), *method.parameters()] if p.requires_grad], lr=0.05)
        for step in range(3):
            loss, _ = method([v.to(device) for v in make_views(step)], backbone)
            opt.zero_grad()
            loss.backward()
            method.before_optimizer_step()
            opt.step()
            method.after_step(step, 10, backbone)
        states.append({k: v.float().cpu() for k, v in method.state_dict().items() if torch.is_tensor(v)})
    cpu, gpu = states
    assert cpu.keys() == gpu.keys()
    for key in cpu:
        torch.testing.assert_close(gpu[key], cpu[key], rtol=2e-3, atol=2e-4, msg=key)
