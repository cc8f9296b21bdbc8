"""SwaV (Caron et al., 2020): swapped prediction of Sinkhorn cluster assignments, with multi-crop.

Assignments are computed on the global views only (lightly's SwaVLoss), with Sinkhorn normalised over the
GLOBAL batch (``sinkhorn_gather_distributed=True``); every view predicts the other views' assignments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from lightly.loss import SwaVLoss
from lightly.models.modules import SwaVProjectionHead, SwaVPrototypes
from lightly.models.modules.memory_bank import MemoryBankModule
from torch import nn

from hypersolid_scale.distributed import get_world_size
from hypersolid_scale.methods.base import Method, Outputs, encode, project
from hypersolid_scale.methods.registry import register


@dataclass
class SwaVConfig:
    hidden_dim: int = 2048  # SwaV paper: 2-layer MLP of width 2048; lightly default
    out_dim: int = 128  # SwaV paper; lightly default
    n_prototypes: int = 3000  # SwaV paper (ImageNet); lightly default
    temperature: float = 0.1  # SwaV paper tau; lightly default
    sinkhorn_iterations: int = 3  # SwaV paper; lightly default
    sinkhorn_epsilon: float = 0.05  # SwaV paper epsilon; lightly default
    freeze_prototypes_steps: int = 313  # SwaV paper: prototypes frozen during the first epoch (313 iterations)
    queue_length: int = 0  # lightly default (off); SwaV paper: 3840 for batches of 256, split across ranks
    queue_start_epoch: int = 15  # SwaV paper: the queue joins the assignment from epoch 15

    KINDS = {
        "hidden_dim": "pos_int",
        "out_dim": "pos_int",
        "n_prototypes": "pos_int",
        "temperature": "pos_float",
        "sinkhorn_iterations": "pos_int",
        "sinkhorn_epsilon": "pos_float",
        "freeze_prototypes_steps": "nonneg_int",
        "queue_length": "nonneg_int",
        "queue_start_epoch": "nonneg_int",
    }


QUEUED_VIEWS = 2  # the SwaV paper keeps one queue per global view, and uses 2 global views


@register
class SwaV(Method):
    """Prototypes are re-normalised before every forward (SwaV paper) and frozen during the first
    ``freeze_prototypes_steps`` steps.

    The freezing drops the prototypes' gradients in :meth:`before_optimizer_step` instead of lightly's
    ``n_steps_frozen_prototypes``, which toggles ``requires_grad``: DistributedDataParallel fixes the set of
    trainable parameters when it wraps the model and fails on a parameter that stops receiving gradients.

    Queue (``queue_length > 0``): each rank keeps ``queue_length // world_size`` past projections per global
    view (as the official implementation), used in the assignments from epoch ``queue_start_epoch``. It is
    per-rank state, carried in this module's extra state (lightly's memory bank keeps it out of the state
    dict).
    """

    name, Config, order = "swav", SwaVConfig, 60
    display_name = "SwAV"
    stateful = True  # the queue fills, the prototypes thaw
    projection_head = "projector"

    uses_local_views = True
    tells_views_by_size = True

    @classmethod
    def compile_refusal(cls, section: Any) -> str:
        return (
            "method.name=swav: "
            "it re-normalises its prototypes in place at every forward and its queue reads its pointer on the host "
            "(lightly's MemoryBankModule): a parameter mutation and a host read inside the graph"
        )

    @classmethod
    def frozen_by_schedule(cls, section: SwaVConfig) -> tuple[str, int] | None:
        steps = section.freeze_prototypes_steps
        return ("freeze_prototypes_steps", steps) if steps > 0 else None

    @classmethod
    def per_rank_state(cls, section: SwaVConfig) -> tuple[str, str] | None:
        return ("method.swav.queue_length", "a queue per rank") if section.queue_length > 0 else None

    def __init__(self, feature_dim: int, cfg: SwaVConfig, steps_per_epoch: int = 1) -> None:
        super().__init__(steps_per_epoch)
        self.projector = SwaVProjectionHead(feature_dim, cfg.hidden_dim, cfg.out_dim)
        self.prototypes = SwaVPrototypes(cfg.out_dim, cfg.n_prototypes, n_steps_frozen_prototypes=0)
        self.criterion = SwaVLoss(
            temperature=cfg.temperature,
            sinkhorn_iterations=cfg.sinkhorn_iterations,
            sinkhorn_epsilon=cfg.sinkhorn_epsilon,
            sinkhorn_gather_distributed=True,
        )
        self.freeze_prototypes_steps = cfg.freeze_prototypes_steps
        self.queue_start_epoch = cfg.queue_start_epoch
        per_rank = cfg.queue_length // get_world_size()
        self.queues = nn.ModuleList(
            [MemoryBankModule(size=(per_rank, cfg.out_dim)) for _ in range(QUEUED_VIEWS)] if per_rank > 0 else []
        )

    def start_step(self) -> None:
        with torch.no_grad():
            self.prototypes.normalize()

    def embed(self, views: list[torch.Tensor], backbone: nn.Module, *, replay: bool = False) -> Outputs:
        views, n_global = self.select_views(views)
        z = project(self.projector, encode(backbone, views, separate=False), separate=False)
        z = [F.normalize(x, dim=1) for x in z]
        logits = list(self.prototypes(torch.cat(z)).chunk(len(z)))
        return {"global_z": z[:n_global], "global_logits": logits[:n_global], "local_logits": logits[n_global:]}

    def loss(self, out: Outputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        queued = self._queue_logits(out["global_z"]) if len(self.queues) else None
        loss = self.criterion(out["global_logits"], out["local_logits"], queued).reshape(())
        return loss, {"loss": loss.detach()}

    @torch.no_grad()
    def _queue_logits(self, global_z: list[torch.Tensor]) -> list[torch.Tensor] | None:
        if len(global_z) != len(self.queues):
            raise ValueError(
                f"the SwaV queue holds {len(self.queues)} global views, got {len(global_z)}; "
                "use 2 global views or method.swav.queue_length=0"
            )
        # Read the queue, then push this batch (lightly's memory bank returns the bank before the update).
        banks = [queue(z, update=True)[1].t() for queue, z in zip(self.queues, global_z)]  # (queue, out_dim)
        if self.epoch < self.queue_start_epoch:
            return None
        return [self.prototypes(bank) for bank in banks]

    def before_optimizer_step(self) -> None:
        if self.step < self.freeze_prototypes_steps:
            for p in self.prototypes.parameters():
                p.grad = None

    def _banks(self) -> list[Any]:
        """The queues (lightly's memory banks; its modules carry no types)."""
        return list(self.queues)

    def get_extra_state(self) -> dict[str, Any]:
        return {**super().get_extra_state(), "queues": [(q.bank.clone(), q.bank_ptr.clone()) for q in self._banks()]}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        super().set_extra_state(state)
        if len(state["queues"]) != len(self.queues):
            raise ValueError(f"the state holds {len(state['queues'])} SwaV queues, this model {len(self.queues)}")
        for q, (bank, ptr) in zip(self._banks(), state["queues"]):
            if bank.shape != q.bank.shape:
                raise ValueError(
                    f"SwaV queue of shape {tuple(bank.shape)} in the state, {tuple(q.bank.shape)} "
                    "here: resume with the same method.swav.queue_length and world size"
                )
            q.bank.copy_(bank)
            q.bank_ptr.copy_(ptr)
