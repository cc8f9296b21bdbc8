"""BatchNorm over the GLOBAL batch on any device and transport, gloo on CPU included (docs/design.md §3b).

With P processes each holding B/P images, a plain BatchNorm normalises over B/P images and P processes no
longer train the network that one process trains on the concatenated batch. torch's ``nn.SyncBatchNorm``
fixes that on CUDA only (it has no CPU kernel); :class:`GlobalBatchNorm` does it with plain tensor ops and
two all-reduces of per-channel sums, so it runs wherever ``torch.distributed`` runs.

Per channel, over every element of every rank's input (N_g elements in all):

    mean = Σ_ranks Σ x / N_g                    (all-reduce 1: the sums and the element counts)
    var  = Σ_ranks Σ (x - mean)² / N_g          (all-reduce 2: two passes, no E[x²] - E[x]² cancellation)
    y    = (x - mean) / sqrt(var + eps) · weight + bias

Both all-reduces are differentiable (``collectives.all_reduce_sum_differentiable``): the backward of a sum
all-reduce is a sum all-reduce of the incoming gradients (its exact adjoint), so the backward carries the
cross-rank terms of the statistics exactly as one process would. Each rank's gradient is then the gradient
of the sum of all ranks' losses, as with SyncBatchNorm; the engines' gradient averaging and the loss's
P-scaling (docs/design.md §3) are unchanged.

Running statistics follow ``nn.BatchNorm`` exactly (momentum, ``momentum=None`` cumulative average,
``num_batches_tracked``) with the global mean and the unbiased global variance Σ(x - mean)² / (N_g - 1);
they are identical on every rank. Ranks may hold different batch sizes (the counts are all-reduced).
Without a process group, or with one rank, the layer is ``nn.BatchNorm`` itself (``F.batch_norm``).
Like SyncBatchNorm, only training mode talks to other ranks: evaluation uses the running statistics (or,
without them, the local batch), so evaluation code need not be collective.

Convert a model with :func:`convert_global_batchnorm` (the analogue of
``nn.SyncBatchNorm.convert_sync_batchnorm``); parameter and buffer names are unchanged, so checkpoints
load into the plain model and back. :func:`convert_batchnorm` applies the ``dist.sync_bn`` setting and picks
between the two layers; the engine builder calls it once, before any engine wraps the model.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.parameter import is_lazy

from hypersolid_scale.distributed.collectives import all_reduce_sum_differentiable, get_world_size
from hypersolid_scale.safety.errors import ConfigError

# Input ranks each converted class accepted, so that the converted layer still refuses the wrong input.
_INPUT_DIMS: tuple[tuple[type, tuple[int, ...]], ...] = (
    (nn.BatchNorm1d, (2, 3)),
    (nn.BatchNorm2d, (4,)),
    (nn.BatchNorm3d, (5,)),
)


class GlobalBatchNorm(_BatchNorm):
    """BatchNorm whose training statistics are those of the global batch across ``process_group``.

    Args:
        num_features, eps, momentum, affine, track_running_stats: as ``nn.BatchNorm*``.
        process_group: the ranks whose inputs form the global batch (default: the default group).
        input_dims: accepted ``input.dim()`` values, e.g. ``(2, 3)`` for a converted BatchNorm1d; None
            accepts any input with at least 2 dimensions.

    Shape:
        (N, C, *) -> (N, C, *); N may differ between ranks.
    """

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        process_group: Any = None,
        input_dims: tuple[int, ...] | None = None,
        device: Any = None,
        dtype: Any = None,
        **kwargs: Any,
    ) -> None:
        # kwargs: what newer torch versions add to nn.BatchNorm (e.g. ``bias=False``), passed through.
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype, **kwargs)
        self.process_group = process_group
        self.input_dims = input_dims

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2 or (self.input_dims is not None and input.dim() not in self.input_dims):
            allowed = "at least 2" if self.input_dims is None else " or ".join(str(d) for d in self.input_dims)
            raise ValueError(
                f"GlobalBatchNorm expected a {allowed}-dimensional input (N, C, ...), got shape {tuple(input.shape)}"
            )
        if input.shape[1] != self.num_features:
            raise ValueError(
                f"GlobalBatchNorm has {self.num_features} channels but the input has "
                f"{input.shape[1]} in dim 1 (shape {tuple(input.shape)})"
            )

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        # The bookkeeping below is nn.BatchNorm's own, so momentum semantics are identical.
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        bn_training = self.training or (self.running_mean is None and self.running_var is None)
        keep_stats = not self.training or self.track_running_stats
        running_mean = self.running_mean if keep_stats else None
        running_var = self.running_var if keep_stats else None
        if not (bn_training and self.training) or get_world_size(self.process_group) == 1:
            return F.batch_norm(input, running_mean, running_var, self.weight, self.bias, bn_training, factor, self.eps)
        return self._global_batch_norm(input, running_mean, running_var, factor)

    def _global_batch_norm(
        self, input: torch.Tensor, running_mean: torch.Tensor | None, running_var: torch.Tensor | None, factor: float
    ) -> torch.Tensor:
        channels = input.shape[1]
        dims = [0, *range(2, input.dim())]  # every dim but the channels
        shape = [1, channels] + [1] * (input.dim() - 2)  # broadcast a (C,) vector against the input
        # Statistics in fp32 for half inputs (as torch's kernels), in the input's precision otherwise.
        acc = torch.float32 if input.dtype in (torch.float16, torch.bfloat16) else input.dtype
        x = input.to(acc)
        local_count = input.numel() // channels
        # The wire carries float64: counts stay exact beyond 2^24 elements per channel (e.g. 4096 images of
        # 112 x 112), and the cross-rank sum of partial sums loses nothing.
        count = torch.tensor([float(local_count)], dtype=torch.float64, device=input.device)
        totals = all_reduce_sum_differentiable(
            torch.cat([x.sum(dims).to(torch.float64), count]), self.process_group
        )  # (C + 1,)
        n = totals[-1].detach()
        # One host read of the count per layer: free on CPU; CUDA runs use SyncBatchNorm (convert_batchnorm).
        if float(n) <= 1:
            raise ValueError(
                f"GlobalBatchNorm needs more than 1 value per channel in training, got {int(n)} "
                f"over all ranks (input shape {tuple(input.shape)} here); use a larger batch"
            )
        mean = (totals[:channels] / n).to(acc)  # (C,)
        centred = x - mean.view(shape)
        sq_sum = all_reduce_sum_differentiable(
            (centred * centred).sum(dims).to(torch.float64), self.process_group
        )  # (C,)
        var = (sq_sum / n).to(acc)  # biased: what normalises, as in nn.BatchNorm
        scale = torch.rsqrt(var + self.eps)
        if self.weight is not None:
            scale = scale * self.weight.to(acc)
        out = centred * scale.view(shape)
        if self.bias is not None:
            out = out + self.bias.to(acc).view(shape)
        if running_mean is not None and running_var is not None:
            with torch.no_grad():
                unbiased = sq_sum.detach() / (n - 1)
                running_mean.copy_(factor * mean.detach().to(running_mean.dtype) + (1.0 - factor) * running_mean)
                running_var.copy_(factor * unbiased.to(running_var.dtype) + (1.0 - factor) * running_var)
        return out.to(input.dtype)


def _input_dims(module: _BatchNorm) -> tuple[int, ...] | None:
    for cls, dims in _INPUT_DIMS:
        if isinstance(module, cls):
            return dims
    return None


def convert_global_batchnorm(module: nn.Module, process_group: Any = None) -> nn.Module:
    """Replace every BatchNorm (``nn.modules.batchnorm._BatchNorm``, SyncBatchNorm included) in ``module``
    by a :class:`GlobalBatchNorm` holding the same parameters and buffers (the same tensors, not copies).

    Returns the converted module (a new object when ``module`` itself is a BatchNorm), like
    ``nn.SyncBatchNorm.convert_sync_batchnorm``.
    """
    out = module
    if isinstance(module, _BatchNorm) and not isinstance(module, GlobalBatchNorm):
        if any(is_lazy(t) for t in (module.weight, module.running_mean) if t is not None):
            raise ValueError(
                f"cannot convert {type(module).__name__} before its first forward (its shape is "
                "not known yet); run one batch through the model, then convert"
            )
        out = GlobalBatchNorm(
            module.num_features,
            module.eps,
            module.momentum,
            module.affine,
            module.track_running_stats,
            process_group,
            input_dims=_input_dims(module),
            device="meta",
        )  # placeholders: the original tensors replace them below
        if module.affine:
            out.weight, out.bias = module.weight, module.bias
        out.running_mean, out.running_var = module.running_mean, module.running_var
        out.num_batches_tracked = module.num_batches_tracked
        out.train(module.training)
        if hasattr(module, "qconfig"):
            out.qconfig = module.qconfig
    for name, child in module.named_children():
        out.add_module(name, convert_global_batchnorm(child, process_group))
    return out


SYNC_BN_CHOICES = ("auto", "true", "false")


def convert_batchnorm(model: nn.Module, sync_bn: str | bool, device: torch.device) -> nn.Module:
    """BatchNorm over the global batch (docs/design.md §3b) when ``sync_bn`` asks for it.

    ``auto``: whenever the world size is > 1 (with one process every BatchNorm already sees the whole batch);
    ``true``: always; ``false``: never (each rank then normalises over its own B/P images only).
    CUDA gets torch's fused ``nn.SyncBatchNorm``; any other device ``GlobalBatchNorm`` (SyncBatchNorm has no
    CPU kernel). Both keep the parameter and buffer names, so checkpoints stay interchangeable.
    """
    setting = str(sync_bn).lower()
    if setting not in SYNC_BN_CHOICES:
        raise ConfigError(f"dist.sync_bn={sync_bn!r} is not allowed; choose one of: {' | '.join(SYNC_BN_CHOICES)}")
    if setting == "false" or (setting == "auto" and get_world_size() == 1):
        return model
    if device.type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return convert_global_batchnorm(model)
