"""The Hypersolid objective (paper, "Method Description"; exact math in DESIGN §1 and §3).

    loss = alignment + repulsion + normalization

* alignment:     mean_{b,v} (1 − x_bv · t_b), with t_b = normalize(max_v feats[b, v]) detached (stop-gradient);
* repulsion:     (1 / M_g²) Σ_{i≠j} ReLU(x_i · x_j − α) / (1 − α) over all ordered pairs of the GLOBAL batch
                 (M_g rows on all ranks together), positives included; the denominator counts the zeroed
                 diagonal, as the paper's mean over the (M × M) matrix does;
* normalization: λ (mean ‖feats‖₂ − 1)² over the global batch, on the un-normalised feats.

Across ranks (DESIGN §3): the detached embeddings are all-gathered once; each rank differentiates only its
own rows. The similarity matrix is symmetric, so the gradient of the global repulsion w.r.t. row i is twice
its row part. The returned tensor carries the true global loss as its value and P × (the gradient of the
global loss w.r.t. the local rows) as its gradient, so DDP's or DeepSpeed's averaging over P ranks yields
exactly the single-process gradient of the concatenated batch. No collective runs in backward.
"""

from __future__ import annotations

from dataclasses import asdict, fields

import torch
import torch.nn.functional as F
from torch import nn

from hypersolid_scale.distributed import all_gather_detached, all_reduce_max, all_reduce_sum, get_world_size
from hypersolid_scale.losses.config import LossConfig
from hypersolid_scale.losses.neighbors import NeighborRepulsion
from hypersolid_scale.losses.repulsion import PairLayout, dense_repulsion, tiled_repulsion

_BACKEND_OPTIONS = {"tile_size", "index", "k", "nprobe", "ef_search", "recall_every"}


class HypersolidLoss(nn.Module):
    """Hypersolid loss over a (possibly distributed) batch of multi-view projector outputs.

    Args:
        alpha: exclusion threshold on cosine similarity, in (-1, 1). Paper: 0.9.
        norm_weight: λ of the L2 normalization term (0 disables it). Paper: 1e-6.
        pooling: how the per-image target is built from its views: "max" (paper) or "mean".
        repel: which pairs are repelled: "all" (paper), "negatives" or "positives".
        backend: "dense" (reference), "tiled" (exact, O(tile²) memory) or "neighbors" (FAISS candidates).
        **backend_options: tile_size; for neighbors: index ("flat" | "ivf" | "hnsw"), k, nprobe,
            ef_search, recall_every.

    Shape:
        feats: (B, V, D) — B images on this process, V ≥ 2 views each, ordered as the model emits them.
        Output: scalar, the loss of the global batch (identical on every rank).

    After each call ``self.stats`` holds floats: loss, alignment, repulsion, normalization, mean_norm,
    active_pairs, active_pos, active_neg, active_fraction, max_cos, and for ``neighbors`` candidates,
    saturated_rows and (when measured) recall. Pair counts are ordered pairs of the global batch.
    """

    def __init__(
        self,
        alpha: float = 0.9,
        norm_weight: float = 1e-6,
        pooling: str = "max",
        repel: str = "all",
        backend: str = "dense",
        **backend_options,
    ) -> None:
        super().__init__()
        unknown = set(backend_options) - _BACKEND_OPTIONS
        if unknown:
            raise ValueError(
                f"unknown backend option(s) {sorted(unknown)}; valid options: {sorted(_BACKEND_OPTIONS)}"
            )
        self.cfg = LossConfig(
            alpha=alpha, norm_weight=norm_weight, pooling=pooling, repel=repel, backend=backend, **backend_options
        )
        self.cfg.validate()
        self._neighbors = (
            NeighborRepulsion(
                index=self.cfg.index,
                k=self.cfg.k,
                nprobe=self.cfg.nprobe,
                ef_search=self.cfg.ef_search,
                recall_every=self.cfg.recall_every,
                tile_size=self.cfg.tile_size,
            )
            if backend == "neighbors"
            else None
        )
        self.stats: dict[str, float] = {}

    @classmethod
    def from_config(cls, cfg: LossConfig) -> "HypersolidLoss":
        values = {f.name: getattr(cfg, f.name) for f in fields(LossConfig)}
        return cls(**values)

    @property
    def alpha(self) -> float:
        return float(self.cfg.alpha)

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in asdict(self.cfg).items())

    def _check(self, feats: torch.Tensor) -> None:
        if not isinstance(feats, torch.Tensor) or feats.dim() != 3:
            shape = tuple(feats.shape) if isinstance(feats, torch.Tensor) else type(feats).__name__
            raise ValueError(f"feats must be a 3-D tensor (B, V, D) of B images × V views × D dims, got {shape}")
        b, v, d = feats.shape
        if v < 2:
            raise ValueError(f"feats has V={v} view(s) per image; the alignment target needs V >= 2 views")
        if b < 1 or d < 1:
            raise ValueError(f"feats has an empty dimension: shape (B={b}, V={v}, D={d})")
        if not feats.is_floating_point():
            raise ValueError(f"feats must be floating point, got dtype {feats.dtype}")
        if not torch.isfinite(feats.detach()).all():
            raise ValueError("feats contains NaN or Inf: check the model outputs (learning rate, mixed precision)")

    def _repulsion_rows(self, x_rows: torch.Tensor, x_all: torch.Tensor, layout: PairLayout):
        if self.cfg.backend == "dense":
            return dense_repulsion(x_rows, x_all, layout, self.alpha)
        if self.cfg.backend == "tiled":
            return tiled_repulsion(x_rows, x_all, layout, self.alpha, self.cfg.tile_size)
        return self._neighbors(x_rows, x_all, layout, self.alpha)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        self._check(feats)
        device_type = feats.device.type
        # Thresholds are decided in fp32 or better, even under bf16/fp16 autocast (DESIGN §2).
        with torch.autocast(device_type=device_type, enabled=False):
            f = feats.float() if feats.dtype in (torch.float16, torch.bfloat16) else feats
            b, v, d = f.shape
            world = get_world_size()
            x = F.normalize(f, dim=-1)  # (B, V, D)

            # Alignment: cosine distance of every view to its image's pooled, detached target.
            pooled = f.max(dim=1).values if self.cfg.pooling == "max" else f.mean(dim=1)  # (B, D)
            target = F.normalize(pooled, dim=-1).detach()
            align_sum = (1.0 - (x * target[:, None, :]).sum(dim=-1)).sum()

            # Normalization: sum of norms here; the global mean needs every rank's sum first.
            norm_sum = f.norm(dim=-1).sum()

            # Repulsion: local rows against the gathered (detached) global batch.
            x_rows = x.reshape(b * v, d)
            x_all, offset = all_gather_detached(x_rows)
            m_g = x_all.shape[0]
            rep_sum, st = self._repulsion_rows(x_rows, x_all, PairLayout(offset, v, self.cfg.repel))

            # One all-reduce for every scalar the global loss and the telemetry need.
            has_recall = st.recall is not None
            packed = torch.tensor(
                [
                    float(align_sum.detach()),
                    float(rep_sum.detach()),
                    float(norm_sum.detach()),
                    st.active_pos,
                    st.active_neg,
                    st.candidates,
                    st.saturated_rows,
                    st.recall if has_recall else 0.0,
                    float(has_recall),
                ],
                dtype=torch.float64,
                device=f.device,
            )
            tot = all_reduce_sum(packed).tolist()
            max_cos = float(all_reduce_max(torch.tensor([st.max_cos], device=f.device))[0])

            alpha, lam = self.alpha, float(self.cfg.norm_weight)
            rep_scale = 1.0 / (m_g * m_g * (1.0 - alpha))
            mean_norm = tot[2] / m_g
            alignment, repulsion = tot[0] / m_g, tot[1] * rep_scale
            normalization = lam * (mean_norm - 1.0) ** 2
            value = alignment + repulsion + normalization

            # Gradient carrier: the gradient of the global loss w.r.t. this rank's rows (DESIGN §3), times P.
            surrogate = (
                align_sum / m_g + 2.0 * rep_scale * rep_sum + (2.0 * lam * (mean_norm - 1.0) / m_g) * norm_sum
            )
            carrier = world * (surrogate - surrogate.detach())
            loss = carrier + torch.tensor(value, dtype=carrier.dtype, device=carrier.device)

        active = tot[3] + tot[4]
        self.stats = {
            "loss": value,
            "alignment": alignment,
            "repulsion": repulsion,
            "normalization": normalization,
            "mean_norm": mean_norm,
            "active_pairs": active,
            "active_pos": tot[3],
            "active_neg": tot[4],
            "active_fraction": active / max(1, m_g * (m_g - 1)),
            "max_cos": max_cos,
        }
        if self.cfg.backend == "neighbors":
            self.stats.update(candidates=tot[5], saturated_rows=tot[6])
            if tot[8] > 0:
                self.stats["recall"] = tot[7] / tot[8]
        return loss  # float32 for low-precision input: the loss value is never rounded to bf16
