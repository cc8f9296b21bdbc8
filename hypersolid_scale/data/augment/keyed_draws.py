"""Per-sample draws that follow the sample, not a generator's history (docs/design.md §3b).

A view's decisions for a sample are fixed columns of one row of uniforms that depends only on (seed, epoch,
sample index, view) (`keyed_uniforms`, a counter-based hash). So a sample gets the same view whatever batch,
rank, world size or resume position it is processed in. Used by the batched crops (`tensor_aug.py`) and the
photometric chain (`photometric.py`).
"""

from __future__ import annotations

import torch

from hypersolid_scale.data.loading.common import DOMAIN_TENSOR_VIEW, hash32, sample_hash, stream_key

# Column layout of one view's row of uniforms.
CROP_ATTEMPTS = 10  # torchvision's RandomResizedCrop tries
COL_CROP = 0  # 2 * CROP_ATTEMPTS + 2 columns: areas, log-aspects, then (x, y) position
COL_FLIP = COL_CROP + 2 * CROP_ATTEMPTS + 2
COL_JITTER = COL_FLIP + 1  # apply?
COL_JITTER_FACTORS = COL_JITTER + 1  # brightness, contrast, saturation, hue
COL_JITTER_ORDER = COL_JITTER_FACTORS + 4  # 4 keys, argsorted into the order of the jitters
COL_GRAY = COL_JITTER_ORDER + 4
COL_BLUR = COL_GRAY + 1
COL_SIGMA = COL_BLUR + 1
COL_SOLARIZE = COL_SIGMA + 1
NUM_COLUMNS = COL_SOLARIZE + 1


def keyed_uniforms(seed: int, epoch: int, indices: torch.Tensor, view: int, columns: int = NUM_COLUMNS) -> torch.Tensor:
    """(n, columns) float32 uniforms in [0, 1): row i depends only on (seed, epoch, indices[i], view).

    24-bit resolution, like torch.rand's float32; computed on `indices.device`, bit-identical on any device.
    """
    if indices.ndim != 1 or indices.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"indices must be a 1-D integer tensor of sample indices, got {indices.dtype} "
            f"of shape {tuple(indices.shape)}"
        )
    key = stream_key(seed, epoch, view, DOMAIN_TENSOR_VIEW)
    rows = sample_hash(key, indices.long())  # (n,)
    cols = hash32(torch.arange(columns, device=indices.device, dtype=torch.int64) + 0x632BE5AB)  # (columns,)
    bits = hash32(rows[:, None] ^ cols[None, :])  # (n, columns) in [0, 2**32)
    return (bits >> 8).to(torch.float32) * (1.0 / (1 << 24))


def check_indices(indices: torch.Tensor, n: int) -> torch.Tensor:
    """The batch's dataset indices, checked where they are (the loaders keep them on the CPU: no sync)."""
    if not isinstance(indices, torch.Tensor) or indices.shape != (n,):
        shape = tuple(indices.shape) if isinstance(indices, torch.Tensor) else type(indices).__name__
        raise ValueError(f"indices must be a ({n},) tensor of the batch's dataset indices, got {shape}")
    if bool((indices < 0).any()):
        raise ValueError(f"dataset indices must be >= 0, got {indices.min().item()}")
    return indices
