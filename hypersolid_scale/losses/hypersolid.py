"""The Hypersolid objective (paper, "Method Description"; exact math in docs/design.md §1 and §3).

    loss = alignment + repulsion + normalization

* alignment:     mean_{b,v} (1 − x_bv · t_b), with t_b = normalize(max_v feats[b, v]) detached (stop-gradient);
* repulsion:     (1 / M_g²) Σ_{i≠j} ReLU(x_i · x_j − α) / (1 − α) over all ordered pairs of the GLOBAL batch
                 (M_g rows on all ranks together), positives included; the denominator counts the zeroed
                 diagonal, as the paper's mean over the (M × M) matrix does;
* normalization: λ (mean ‖feats‖₂ − 1)² over the global batch, on the un-normalised feats.

Across ranks (docs/design.md §3): the detached embeddings are all-gathered once (or passed round the ranks by the
``ring`` backend, §3f); each rank differentiates only its own rows. The similarity matrix is symmetric, so the
gradient of the global repulsion w.r.t. row i is twice its row part. The returned tensor carries the true global
loss as its value and P × (the gradient of the global loss w.r.t. the local rows) as its gradient, so DDP's or
DeepSpeed's averaging over P ranks yields exactly the single-process gradient of the concatenated batch. No
collective runs in backward.

Telemetry stays on the device: every scalar the global loss and the statistics need goes into one vector,
reduced across ranks in one collective; the result, with the derived statistics, is :attr:`packed_stats`
(a :class:`~hypersolid_scale.losses.stats.PackedStats`). The repulsion's backend
(:mod:`hypersolid_scale.losses.backends`, one module each) adds its own statistics; built as the trainer
builds it (``check_finite=False``, ``same_rows_per_rank=True``), a call reads nothing on the host beyond
what its backend reads (each backend's module says what). The ``stats`` property is the host view: one
transfer.
"""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hypersolid_scale.distributed import all_reduce_packed, get_world_size
from hypersolid_scale.losses.backends import Backend, get_backend
from hypersolid_scale.losses.config import LossConfig, loss_config
from hypersolid_scale.losses.repulsion import RepulsionStats
from hypersolid_scale.losses.stats import PackedStats

BASE_STATS = (
    "loss",
    "alignment",
    "repulsion",
    "normalization",
    "mean_norm",
    "active_pairs",
    "active_pos",
    "active_neg",
    "active_fraction",
    "max_cos",
    "nonfinite",
)
# RepulsionStats fields summed across ranks (max_cos is reduced by maximum)
_SUMMED = tuple(name for name in RepulsionStats.__dataclass_fields__ if name != "max_cos")


class HypersolidLoss(nn.Module):
    """Hypersolid loss over a (possibly distributed) batch of multi-view projector outputs.

    Args:
        alpha: exclusion threshold on cosine similarity, in (-1, 1). Paper: 0.9.
        norm_weight: λ of the L2 normalization term (0 disables it). Paper: 1e-6.
        pooling: how the per-image target is built from its views: "max" (paper) or "mean".
        repel: which pairs are repelled: "all" (paper), "negatives" or "positives".
        backend: how the repulsion is computed: a name registered in :mod:`hypersolid_scale.losses.backends`
            (built in: "dense", the reference; "tiled", exact with O(tile²) memory; "neighbors", candidate
            search; "auto", tiled or neighbors per step, docs/design.md §3c; "ring", tiled with a point-to-point
            exchange instead of the all_gather, §3f).
        check_finite: raise ``ValueError`` on NaN/inf input. That check reads a device value on the host
            (a GPU synchronisation); the trainer turns it off and reads the ``nonfinite`` statistic instead.
        same_rows_per_rank: every rank holds as many rows as this one (the trainer's fixed per-rank batch),
            so the all_gather skips its row-count exchange, a host synchronisation. Default False.
        **backend_options: the other fields of :data:`LossConfig`: ``tile_size``, ``screen``, a backend's section
            as a dict of its keys or its options dataclass (``neighbors={"k": 8}``), or a backend's key by its own
            name (``k=8``; :func:`~hypersolid_scale.losses.config.loss_config`), read by the backends that use
            them.

    Shape:
        feats: (B, V, D) — B images on this process, V ≥ 2 views each, ordered as the model emits them.
        Output: scalar, the loss of the global batch (identical on every rank).

    After each call :attr:`packed_stats` holds, on the device, for the global batch: loss, alignment,
    repulsion, normalization, mean_norm, active_pairs, active_pos, active_neg, active_fraction, max_cos,
    nonfinite (non-finite input values + 1 if the loss is not finite); then the backend's own statistics
    (:attr:`Backend.stat_names <hypersolid_scale.losses.backends.Backend.stat_names>`). Pair counts are
    ordered pairs. :attr:`stats` is the same as Python floats (one transfer), without recall/recall_measured
    when recall was not measured. The backend instance is :attr:`backend` (e.g. the ``auto``
    backend's ``switch`` is ``loss.backend.switch``).
    """

    def __init__(
        self,
        alpha: float = 0.9,
        norm_weight: float = 1e-6,
        pooling: str = "max",
        repel: str = "all",
        backend: str = "dense",
        *,
        check_finite: bool = True,
        same_rows_per_rank: bool = False,
        **backend_options: Any,
    ) -> None:
        super().__init__()
        self.cfg = loss_config(
            alpha=alpha, norm_weight=norm_weight, pooling=pooling, repel=repel, backend=backend, **backend_options
        )
        self.cfg.validate()
        self.check_finite, self.same_rows_per_rank = bool(check_finite), bool(same_rows_per_rank)
        self.backend: Backend = get_backend(backend)(self.cfg)
        self.stat_names: tuple[str, ...] = BASE_STATS + tuple(self.backend.stat_names)
        self._packed: PackedStats | None = None

    @classmethod
    def from_config(cls, cfg: LossConfig, **runtime: bool) -> HypersolidLoss:
        """``runtime``: check_finite / same_rows_per_rank (how the caller runs it, not hyperparameters)."""
        kwargs: dict[str, Any] = {**{f.name: getattr(cfg, f.name) for f in fields(LossConfig)}, **runtime}
        return cls(**kwargs)

    @property
    def alpha(self) -> float:
        return float(self.cfg.alpha)

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in asdict(self.cfg).items())

    @property
    def packed_stats(self) -> PackedStats:
        """The last call's statistics, on the device (names: :attr:`stat_names`)."""
        if self._packed is None:
            raise RuntimeError("no statistics yet: call the loss first")
        return self._packed

    @property
    def stats(self) -> dict[str, float]:
        """The last call's statistics as Python floats: ONE device-to-host transfer (a sync on CUDA)."""
        if self._packed is None:
            return {}
        out = self._packed.to_dict()
        if "recall_measured" in out and out["recall_measured"] == 0:
            del out["recall"], out["recall_measured"]
        return out

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
        if self.check_finite and not torch.isfinite(feats.detach()).all():
            raise ValueError("feats contains NaN or Inf: check the model outputs (learning rate, mixed precision)")

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        self._check(feats)
        device_type = feats.device.type
        # Thresholds are decided in fp32 or better, even under bf16/fp16 autocast (docs/design.md §2).
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

            # Repulsion: local rows against every rank's (detached) rows; the backend moves them (by default one
            # all_gather, docs/design.md §3; ring: a point-to-point pass, §3f).
            x_rows = x.reshape(b * v, d)
            rep_sum, st, m_g = self.backend.exchange(
                x_rows, v, self.cfg.repel, self.alpha, same_rows_per_rank=self.same_rows_per_rank
            )

            # One collective for every scalar the global loss and the telemetry need (sums, and max_cos).
            nonfinite = (~torch.isfinite(f.detach())).sum()
            sums = torch.stack(
                [
                    align_sum.detach().double(),
                    rep_sum.detach().double(),
                    norm_sum.detach().double(),
                    nonfinite.double(),
                    *(getattr(st, name).double() for name in _SUMMED),
                ]
            )
            tot, mx = all_reduce_packed(sums, st.max_cos.double().reshape(1))
            g = dict(zip(("align", "rep", "norm", "nonfinite", *_SUMMED), tot.unbind(0)))

            alpha, lam = self.alpha, float(self.cfg.norm_weight)
            rep_scale = 1.0 / (m_g * m_g * (1.0 - alpha))
            mean_norm = g["norm"] / m_g
            alignment, repulsion = g["align"] / m_g, g["rep"] * rep_scale
            normalization = lam * (mean_norm - 1.0) ** 2
            value = alignment + repulsion + normalization  # float64, identical on every rank

            # Gradient carrier: the gradient of the global loss w.r.t. this rank's rows (docs/design.md §3), times P.
            norm_coef = (2.0 * lam * (mean_norm - 1.0) / m_g).to(f.dtype)
            surrogate = align_sum / m_g + 2.0 * rep_scale * rep_sum + norm_coef * norm_sum
            carrier = world * (surrogate - surrogate.detach())
            loss = carrier + value.to(carrier.dtype)

            active = g["active_pos"] + g["active_neg"]
            out = {
                "loss": value,
                "alignment": alignment,
                "repulsion": repulsion,
                "normalization": normalization,
                "mean_norm": mean_norm,
                "active_pairs": active,
                "active_pos": g["active_pos"],
                "active_neg": g["active_neg"],
                "active_fraction": active / max(1, m_g * (m_g - 1)),
                "max_cos": mx[0],
                "nonfinite": g["nonfinite"] + (~torch.isfinite(value)).double(),
            }
            out.update(self.backend.derive(g, m_g, value))
            packed = PackedStats(self.stat_names, torch.stack([out[name] for name in self.stat_names]))
        self._packed = packed
        self.backend.observe(packed)
        return loss  # float32 for low-precision input: the loss value is never rounded to bf16
