"""PIL-path transforms: lightly's DINOTransform for training views, a deterministic one for evaluation.

The PIL path is the semantic reference: the batched tensor path (`tensor_aug.py`) and the FFCV path are
tested against it. `seeded_global_rngs` makes a sample's views a function of (seed, epoch, sample index)
only (docs/design.md §3b).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import torch
from lightly.transforms.dino_transform import DINOTransform
from PIL import Image
from torchvision import transforms as T

from hypersolid_scale.data.augment.presets import MultiCropPreset, normalize_dict
from hypersolid_scale.data.loading.common import mix_seed


def build_pil_multicrop(preset: MultiCropPreset) -> DINOTransform:
    """PIL image -> list of normalised tensors [global_0, global_1, local_0, ...] (lightly DINOTransform)."""
    bri, con, sat, hue = preset.cj_factors
    return DINOTransform(
        global_crop_size=preset.global_crop_size,
        global_crop_scale=preset.global_crop_scale,
        local_crop_size=preset.local_crop_size,
        local_crop_scale=preset.local_crop_scale,
        n_local_views=preset.num_local_views,
        hf_prob=preset.hflip_prob,
        vf_prob=0.0,
        rr_prob=0.0,
        cj_prob=preset.cj_prob,
        cj_strength=preset.cj_strength,
        cj_bright=bri,
        cj_contrast=con,
        cj_sat=sat,
        cj_hue=hue,
        random_gray_scale=preset.gray_prob,
        gaussian_blur=preset.blur_probs,
        sigmas=preset.blur_sigmas,
        solarization_prob=preset.solarize_prob,
        normalize=normalize_dict(preset),
    )


@contextmanager
def seeded_global_rngs(seed: int, epoch: int, index: int) -> Iterator[None]:
    """Seed Python's `random`, numpy's and torch's (CPU) global generators from (seed, epoch, index)
    for the duration of the block, then put their previous states back.

    These are the generators lightly's (numpy) and torchvision's (torch) random transforms draw from.
    Each gets its own derived seed, so the three streams are unrelated; restoring the states keeps the
    caller's streams (e.g. the trainer's, when the DataLoader has no workers) untouched.
    """
    saved = random.getstate(), np.random.get_state(), torch.get_rng_state()
    random.seed(mix_seed(seed, epoch, index, 0))
    np.random.seed(mix_seed(seed, epoch, index, 1) % 2**32)
    torch.default_generator.manual_seed(mix_seed(seed, epoch, index, 2))
    try:
        yield
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])
        torch.set_rng_state(saved[2])


def pil_mode(preset: MultiCropPreset) -> str:
    return "L" if preset.channels == 1 else "RGB"


def build_eval_transform(preset: MultiCropPreset) -> Callable[[Image.Image], torch.Tensor]:
    """Deterministic: resize the short side to eval_resize, center-crop global_crop_size, normalise."""
    return T.Compose(
        [
            T.Resize(preset.eval_resize, interpolation=T.InterpolationMode.BICUBIC),
            T.CenterCrop(preset.global_crop_size),
            T.ToTensor(),
            T.Normalize(mean=list(preset.mean), std=list(preset.std)),
        ]
    )
