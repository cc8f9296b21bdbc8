"""What an evaluation reads: the train and test datasets of the run's data section (``eval_datasets``), a
seeded subset of them (``capped``) and the test images the qualitative suite draws (``sample_images``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset, Subset

from hypersolid_scale.eval.sampling import subsample
from hypersolid_scale.eval.suites import Images
from hypersolid_scale.safety.errors import ConfigError, DataError, UserError


def capped(ds: Dataset, max_n: int | None, seed: int) -> Dataset:
    """A seeded random subset of at most ``max_n`` samples (a random one: datasets may be sorted by class)."""
    n = len(ds)  # type: ignore[arg-type]
    if max_n is None or n <= max_n:
        return ds
    return Subset(ds, subsample(n, max_n, seed).tolist())


def eval_datasets(cfg: Any, checkpoint: Path | None) -> tuple[Dataset, Dataset]:
    """The (train, test) evaluation datasets of ``cfg.data``; a ``DataError`` saying how to point at them."""
    from hypersolid_scale.data import build_eval_datasets

    try:
        return build_eval_datasets(cfg.data)
    except (UserError, OSError, ValueError) as err:  # data's contract: missing, unreadable or inconsistent data
        # The location comes from the checkpoint's config, written where it was trained: say how to move it.
        cls = ConfigError if isinstance(err, ConfigError) else DataError
        where = "given" if checkpoint is None else f"recorded in checkpoint {str(checkpoint)!r}"
        damaged = isinstance(err, DataError) and "hypersolid_scale.data.convert" in str(err)  # fix already named
        hint = "" if damaged else ". Pass data.path=... (and data.test_path=...) to point at that data on this machine"
        raise cls(
            f"cannot open the evaluation data {where} ({cfg.data.describe()}, data.path={cfg.data.path!r}): {err}{hint}"
        ) from None


def sample_images(ds: Dataset, cfg: Any, n: int, seed: int) -> Images:
    """A seeded random draw of ``n`` samples of ``ds`` (model inputs and labels), with the preset's
    normalisation and the dataset's class names for display."""
    from hypersolid_scale.data import resolve_preset

    items = [ds[int(i)] for i in subsample(len(ds), n, seed)]  # type: ignore[arg-type]
    preset = resolve_preset(cfg.data)
    base = ds
    while isinstance(base, Subset):
        base = base.dataset
    names = getattr(base, "classes", None)  # torchvision's ImageFolder; in-memory datasets show "class <k>"
    return Images(
        torch.stack([x for x, _ in items]),
        torch.tensor([int(y) for _, y in items]),
        mean=list(preset.mean),
        std=list(preset.std),
        class_names=list(names) if names else None,
    )
