"""The random decisions of the PIL path's views, drawn without touching a pixel (for `data.views_on=device`).

The PIL path (lightly's DINOTransform, `transforms.py`) draws each view's crop box, flip, jitter, grayscale,
blur and solarization from Python's, numpy's and torch's global generators, seeded per sample by
`seeded_global_rngs(seed, epoch, sample)`. `draw_view_params` walks the same transform objects in the same
order and makes the same generator calls (torchvision v2's `make_params` and the `torch.rand(1) >= p` tests
of its random-apply transforms, lightly's numpy draws), given only the image's size. So, under the same
seeding, it returns exactly the parameters the PIL path uses, and leaves the generators in the same state,
while the pixels are done later, batched on the training device (`data/device/views.py`). A transform it does not
know raises, so a change in lightly's recipe cannot silently desynchronise the two paths.

Hand-written: torchvision and lightly draw and apply in one call; neither exposes the draws alone.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from lightly.transforms.gaussian_blur import GaussianBlur
from lightly.transforms.rotation import RandomRotate
from lightly.transforms.solarize import RandomSolarization
from torchvision.transforms import v2

# Columns of one view's parameter row.
TOP, LEFT, HEIGHT, WIDTH = 0, 1, 2, 3  # crop box in pixels of the decoded image
FLIP = 4  # horizontal flip
JITTER = 5  # colour jitter applied
ORDER = 6  # 4 columns: the jitters' order (0 brightness, 1 contrast, 2 saturation, 3 hue)
FACTORS = 10  # 4 columns: brightness, contrast, saturation factors and the hue shift
GRAY = 14
BLUR = 15
SIGMA = 16
SOLARIZE = 17
IMAGE_HEIGHT, IMAGE_WIDTH = 18, 19  # the decoded image's size the draws were made for
NUM_PARAMS = 20

# Transforms that draw nothing and leave the pixels to the end of the chain (ToTensor, Normalize).
_PASSIVE = ("ToTensor", "Normalize", "ToImage", "ToDtype")


def sample_id(key: str) -> int:
    """A stable 63-bit id of a sample key (WebDataset's ``__key__``), the sample index of its random stream."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") >> 1


def _size_only(height: int, width: int) -> torch.Tensor:
    """A (1, H, W) tensor of no memory: what `make_params` needs to read the size."""
    return torch.zeros(()).expand(1, height, width)


def _draw(t: Any, row: np.ndarray, fake: list[torch.Tensor]) -> None:
    """The generator calls of transform `t` on an image of `fake`'s size; its decisions go into `row`."""
    if isinstance(t, v2.RandomResizedCrop):
        p = t.make_params(fake)
        row[[TOP, LEFT, HEIGHT, WIDTH]] = (p["top"], p["left"], p["height"], p["width"])
    elif isinstance(t, (v2.RandomHorizontalFlip, v2.RandomVerticalFlip, v2.RandomGrayscale)):
        hit = not bool(torch.rand(1) >= t.p)  # torchvision's _RandomApplyTransform test
        if isinstance(t, v2.RandomVerticalFlip):
            if hit:
                raise NotImplementedError("data.views_on=device does not do vertical flips (no preset uses them)")
        else:
            row[FLIP if isinstance(t, v2.RandomHorizontalFlip) else GRAY] = hit
    elif isinstance(t, v2.RandomApply):
        if torch.rand(1) >= t.p:
            return
        (jitter,) = t.transforms
        if not isinstance(jitter, v2.ColorJitter):
            raise NotImplementedError(f"data.views_on=device: RandomApply of {type(jitter).__name__} is not supported")
        p = jitter.make_params(fake)
        row[JITTER] = 1
        row[ORDER : ORDER + 4] = p["fn_idx"].numpy()
        neutral = (1.0, 1.0, 1.0, 0.0)  # a jitter the transform leaves out (None) changes nothing
        for k, name in enumerate(("brightness_factor", "contrast_factor", "saturation_factor", "hue_factor")):
            row[FACTORS + k] = neutral[k] if p[name] is None else p[name]
    elif isinstance(t, RandomRotate):
        if np.random.random_sample() < t.prob:
            raise NotImplementedError("data.views_on=device does not do rotations (no preset uses them)")
    elif isinstance(t, GaussianBlur):
        if np.random.random_sample() < t.prob:
            row[BLUR] = 1
            row[SIGMA] = np.random.uniform(t.sigmas[0], t.sigmas[1])
    elif isinstance(t, RandomSolarization):
        if np.random.random_sample() < t.prob:
            if t.threshold != 128:
                raise NotImplementedError(f"data.views_on=device solarizes at 128, not {t.threshold}")
            row[SOLARIZE] = 1
    elif type(t).__name__ not in _PASSIVE:
        raise NotImplementedError(
            f"data.views_on=device cannot replay {type(t).__name__} of the PIL multi-crop; use data.views_on=workers"
        )


def view_transforms(multicrop: Any) -> Sequence[Sequence[Any]]:
    """The per-view transform lists of a lightly multi-view transform (DINOTransform)."""
    return [view.transform.transforms for view in multicrop.transforms]


def draw_view_params(views: Sequence[Sequence[Any]], height: int, width: int) -> np.ndarray:
    """(V, NUM_PARAMS) float64: the decisions the PIL path makes for an image of `height` x `width`.

    Call it where the PIL path would run its transform (inside `seeded_global_rngs`): the draws are the same.
    """
    out = np.zeros((len(views), NUM_PARAMS), dtype=np.float64)
    out[:, FACTORS : FACTORS + 3] = 1.0
    out[:, IMAGE_HEIGHT], out[:, IMAGE_WIDTH] = height, width
    fake = [_size_only(height, width)]
    for v, transforms in enumerate(views):
        for t in transforms:
            _draw(t, out[v], fake)
    return out
