"""Exact gradient accumulation (training/accumulation.py) against the simple reference, for every method.

The reference keeps every micro-batch's graph: embed each micro-batch WITH autograd, concatenate the outputs,
take the loss once and back-propagate it. The accumulated step must give the same loss, the same gradients
and the same buffers (BatchNorm running statistics updated once per micro-batch; a teacher, DINO's center
and SwaV's queue updated once per step) while holding one micro-batch's graph at a time. The backbone has
BatchNorm AND dropout, so the random-state replay and the buffer restore are both exercised; replaying a
different random state or letting pass 2 update the buffers again fails these tests.
"""

from __future__ import annotations

import pytest
import torch
from test_methods import small_cfg
from torch import nn

from hypersolid_scale.distributed import build_engine
from hypersolid_scale.methods import MethodModel, build_method, get_method, method_names
from hypersolid_scale.training.accumulation import accumulated_step, concat_outputs, split_views

pytestmark = pytest.mark.filterwarnings("ignore:.*weight_norm.*:FutureWarning")  # lightly's DINO head

B, K = 12, 3


class DropoutCNN(nn.Module):
    """Conv, BatchNorm, dropout: any image size in, 8 features out."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.Dropout(0.3),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


# Every method, and Hypersolid under each exact loss backend (the loss runs once, on all rows, whatever it is).
CASES = [*method_names(), "hypersolid:tiled", "hypersolid:neighbors", "hypersolid:auto"]


def make_model(case: str) -> MethodModel:
    torch.manual_seed(0)
    backbone = DropoutCNN()
    name, _, backend = case.partition(":")
    cfg = small_cfg(name)
    if backend:
        cfg.hypersolid.backend = backend
        cfg.hypersolid.tile_size, cfg.hypersolid.neighbors.k = 5, 4  # several tiles; fewer candidates than rows
    if name == "swav":
        cfg.swav.queue_start_epoch = 0  # the queue takes part in the assignment from the first step
    method = build_method(cfg, backbone, 8, steps_per_epoch=2)
    return MethodModel(backbone, 8, method)


def make_views(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, 3, 16, 16, generator=g) for _ in range(2)] + [
        torch.randn(B, 3, 8, 8, generator=g) for _ in range(2)
    ]


def reference_step(model: MethodModel, views: list[torch.Tensor]) -> torch.Tensor:
    """Every micro-batch's graph kept; one loss over all rows."""
    model.method.start_step()
    outs = [model(batch, embed=True) for batch in split_views(views, K)]
    loss, _ = model.method.loss(concat_outputs(outs))
    loss.backward()
    return loss.detach()


def engine_for(model: MethodModel):
    return build_engine(
        model, lambda p: torch.optim.SGD(p, lr=0.1), engine="ddp", device=torch.device("cpu"), bf16=False, grad_clip=0.0
    )


@pytest.mark.parametrize("name", CASES)
def test_accumulated_step_equals_the_full_graph_reference(name):
    ref, acc = make_model(name), make_model(name)
    engine = engine_for(acc)
    # A second step where there is state: a filled SwaV queue, a moved DINO center, a teacher that moved.
    for step in range(2 if get_method(name.split(":")[0]).stateful else 1):
        views = make_views(step)
        torch.manual_seed(100 + step)
        want = reference_step(ref, views)
        torch.manual_seed(100 + step)
        got, stats = accumulated_step(engine, acc.method, acc, views, K)
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-7), (name, step, got, want)
        assert float(stats["loss"]) == pytest.approx(float(want), rel=1e-5)
        # Elementwise, against the largest gradient: a bias before BatchNorm has an exact gradient of 0 and a
        # computed one of rounding noise, which no relative tolerance on that element could hold.
        scale = max(p.grad.abs().max().item() for p in ref.parameters() if p.grad is not None)
        for (pname, p_ref), p_acc in zip(ref.named_parameters(), acc.parameters()):
            if p_ref.grad is None:
                assert p_acc.grad is None, pname
                continue
            torch.testing.assert_close(
                p_acc.grad, p_ref.grad, rtol=1e-5, atol=1e-5 * scale, msg=lambda m: f"{name} {pname}: {m}"
            )
        for (bname, b_ref), b_acc in zip(ref.named_buffers(), acc.buffers()):
            if "criterion.memory_bank" in bname:  # lightly's NT-Xent bank, unused (size 0): never written
                continue
            torch.testing.assert_close(b_acc, b_ref, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name} {bname}: {m}")
        with torch.no_grad():  # an SGD step, then both start the next step from the very same state
            for p in ref.parameters():
                if p.grad is not None:
                    p -= 0.1 * p.grad
        for m in (ref, acc):
            m.zero_grad(set_to_none=True)
            m.method.after_step(step, 10, m.backbone)
        acc.load_state_dict(ref.state_dict())


def test_the_random_state_after_the_step_is_the_one_after_the_first_pass():
    """Pass 2 replays the first pass's dropout masks and then leaves the stream where pass 1 left it."""
    model = make_model("simclr")
    engine = engine_for(model)
    views = make_views(0)
    torch.manual_seed(7)
    with torch.no_grad():
        for batch in split_views(views, K):
            model(batch, embed=True)
    want = torch.rand(3)
    torch.manual_seed(7)
    accumulated_step(engine, model.method, model, views, K)
    assert torch.equal(torch.rand(3), want)


def test_micro_batches_are_the_ranks_rows():
    views = [torch.arange(12).reshape(12, 1, 1, 1).float()]
    parts = split_views(views, 3)
    assert [p[0].flatten().tolist() for p in parts] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
