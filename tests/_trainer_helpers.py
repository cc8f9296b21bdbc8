"""Helpers for the trainer's tests: a BatchNorm-free model, the N-process vs 1-process equality worker and
single-process DeepSpeed checks (resumed weights, bf16 with BatchNorm).

Run as a script under torchrun, the worker trains the same model from the same initial weights on the same
global batches (rank r holding rows [r*b, (r+1)*b)) with each requested engine, and rank 0 writes the final
parameters to ``<out>/<engine>.pt``. Without torchrun it computes the single-process reference.

The model here has no BatchNorm on purpose: this test isolates the engines and the loss's contract.
BatchNorm over the global batch is tested on its own (tests/test_batchnorm.py) and with everything together
through launch/train.py (tests/test_world_invariance.py).
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GLOBAL_BATCH = 8
STEPS = 4
VIEWS = ((2, 8), (2, 4))  # (count, size): 2 global 8 px views, 2 local 4 px views


class TinyNet(nn.Module):
    """What the trainer's module (``MethodModel``) is to the engine, without BatchNorm: ``views -> (loss, stats)``,
    Hypersolid's loss on (B, V, D) embeddings made as ``embed_views`` makes them."""

    def __init__(self, dim: int = 16) -> None:
        from hypersolid_scale.losses import HypersolidLoss

        super().__init__()
        self.conv = nn.Conv2d(1, 4, kernel_size=3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.head = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, dim))
        # alpha 0.3: most pairs of a random network lie inside the exclusion zone, so repulsion dominates.
        self.loss = HypersolidLoss(alpha=0.3, norm_weight=1e-3)

    def forward(self, views: list[torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        z = torch.stack([self.head(self.pool(torch.relu(self.conv(v))).flatten(1)) for v in views], dim=1)
        # The loss decides its thresholds in fp32 or better (docs/design.md §2), whatever the autocast dtype.
        loss = self.loss(z if z.dtype == torch.float64 else z.float())
        return loss, {"loss": loss.detach()}


def train_step(engine, views: list[torch.Tensor]) -> torch.Tensor:
    """The trainer's step without accumulation (``training.step.train_step``): the engine's wrapped module
    under the engine's autocast gives the loss, then the engine's backward and optimizer step."""
    with engine.autocast():
        loss, _ = engine.wrapped(views)
    engine.backward(loss)
    engine.step()
    return loss


def global_batches() -> list[list[torch.Tensor]]:
    g = torch.Generator().manual_seed(1234)
    out = []
    for _ in range(STEPS):
        out.append([torch.randn(GLOBAL_BATCH, 1, s, s, generator=g) for n, s in VIEWS for _ in range(n)])
    return out


def train_params(engine_kind: str, *, zero_stage: int = 0, rank: int = 0, world: int = 1,
                 resume_at: int | None = None) -> dict[str, torch.Tensor]:
    """Final parameters after STEPS steps; ``resume_at=k`` rebuilds the engine after k steps from its state."""
    from hypersolid_scale.distributed import build_engine
    from hypersolid_scale.training.optim import build_optimizer

    def make(state: dict | None = None):
        torch.manual_seed(0)
        model = TinyNet()
        if state is not None:
            model.load_state_dict(state["model"])
        engine = build_engine(
            # SGD, not Adam: Adam's update is blind to a constant factor on the gradient, the very error
            # (x P or / P across ranks) this comparison must catch.
            model, lambda p: build_optimizer("sgd", p, lr=0.5, weight_decay=1e-6, momentum=0.9,
                                             betas=(0.9, 0.999)),
            engine=engine_kind, device=torch.device("cpu"), bf16=False, grad_clip=0.0, zero_stage=zero_stage,
            batch_size_per_gpu=GLOBAL_BATCH // world)
        if state is not None:
            engine.load_optimizer_state(state["optimizer"])
        return engine

    from hypersolid_scale.distributed import broadcast_object

    engine = make()
    b = GLOBAL_BATCH // world
    for i, views in enumerate(global_batches()):
        if resume_at is not None and i == resume_at:
            state = {"model": {k: v.clone() for k, v in engine.model.state_dict().items()},
                     "optimizer": engine.optimizer_state()}
            state = broadcast_object(state)  # the optimizer state lives on rank 0, as in a checkpoint file
            # Through a file, as checkpoints are read: only plain types survive weights_only=True.
            buf = io.BytesIO()
            torch.save(state, buf)
            buf.seek(0)
            state = torch.load(buf, weights_only=True)
            engine = make(state)
        train_step(engine, [v[rank * b:(rank + 1) * b] for v in views])
    return {k: v.detach().float().clone() for k, v in engine.model.state_dict().items()}


def worker(out_dir: str, specs: list[str]) -> None:
    """Under torchrun: every spec is ``engine[:zero_stage[:resume_at]]``."""
    from hypersolid_scale.distributed import cleanup, init_distributed

    info, _ = init_distributed("cpu", "gloo")
    torch.set_num_threads(1)
    for spec in specs:
        parts = spec.split(":")
        kind, stage = parts[0], int(parts[1]) if len(parts) > 1 else 0
        resume_at = int(parts[2]) if len(parts) > 2 else None
        params = train_params(kind, zero_stage=stage, rank=info.rank, world=info.world_size, resume_at=resume_at)
        if info.rank == 0:
            torch.save(params, Path(out_dir) / f"{spec.replace(':', '_')}.pt")
    cleanup()


# ----------------------------------------------------------------------------------------------------------
# Single-process DeepSpeed checks. Each runs in its own interpreter (DeepSpeed wants a process group, which
# would otherwise outlive the test) and saves what the test asserts on.
# ----------------------------------------------------------------------------------------------------------


def _sgd(lr: float):
    from hypersolid_scale.training.optim import build_optimizer

    return lambda p: build_optimizer("sgd", p, lr=lr, weight_decay=0.0, momentum=0.0, betas=(0.9, 0.999))


def deepspeed_load_model_state(out: str, specs: list[str]) -> None:
    """For each ``stage:bf16``: weights loaded into a built engine, then one tiny-lr step.

    Saves ``{spec: {"old", "loaded", "after"}}``; "after" must sit next to "loaded", not to "old".
    """
    from hypersolid_scale.distributed import build_engine

    torch.set_num_threads(1)
    results = {}
    for spec in specs:
        stage, bf16 = int(spec.split(":")[0]), spec.split(":")[1] == "bf16"
        torch.manual_seed(0)
        engine = build_engine(TinyNet(), _sgd(1e-8), engine="deepspeed", device=torch.device("cpu"), bf16=bf16,
                              grad_clip=0.0, zero_stage=stage, batch_size_per_gpu=GLOBAL_BATCH)
        old = {k: v.detach().float().clone() for k, v in engine.model.state_dict().items()}
        loaded = {k: v + 1.0 for k, v in old.items()}  # far from the old weights, as a checkpoint would be
        engine.load_model_state(loaded)
        train_step(engine, global_batches()[0])
        after = {k: v.detach().float().clone() for k, v in engine.model.state_dict().items()}
        results[spec] = {"old": old, "loaded": loaded, "after": after}
    torch.save(results, out)


def deepspeed_bf16_batchnorm_step(out: str) -> None:
    """A model with BatchNorm, DeepSpeed with bf16, two training steps and the online monitor's fp32 forward."""
    from hypersolid_scale.distributed import build_engine
    from hypersolid_scale.methods import MethodModel
    from hypersolid_scale.methods.hypersolid import Hypersolid, HypersolidConfig
    from hypersolid_scale.models import ModelConfig, SmallCNNOptions, build_backbone

    torch.set_num_threads(1)
    torch.manual_seed(0)
    backbone, dim = build_backbone(ModelConfig(arch="small_cnn", in_channels=1, small_cnn=SmallCNNOptions(width=8)))
    model = MethodModel(backbone, dim, Hypersolid(dim, HypersolidConfig(num_layers=2, hidden_dim=32, out_dim=16)))
    engine = build_engine(model, _sgd(0.1), engine="deepspeed", device=torch.device("cpu"), bf16=True,
                          grad_clip=1.0, zero_stage=1, batch_size_per_gpu=4)
    g = torch.Generator().manual_seed(0)
    views = [torch.randn(4, 1, s, s, generator=g) for s in (16, 16, 8)]
    before = {k: v.detach().clone() for k, v in engine.model.named_parameters()}
    losses = []
    for _ in range(2):
        with engine.autocast():  # the trainer's step
            feats = engine.wrapped(views, embed=True)["z"][0]
            loss, _ = engine.model.method.loss({"z": [feats]})
        engine.backward(loss)
        engine.step()
        losses.append(float(loss))
    engine.train(False)
    with torch.no_grad():  # what the kNN monitor does: fp32 images straight into the backbone
        emb = engine.model.backbone(torch.randn(4, 1, 16, 16, generator=g))
    torch.save({"feats_dtype": str(feats.dtype), "loss_dtype": str(loss.dtype), "losses": losses, "before": before,
                "emb": emb,
                "params": {k: v.detach().clone() for k, v in engine.model.named_parameters()},
                "buffers": {k: v.detach().clone() for k, v in engine.model.named_buffers()}}, out)


if __name__ == "__main__":
    worker(sys.argv[1], sys.argv[2:])
