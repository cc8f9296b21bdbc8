"""data.format=builtin: Fashion-MNIST or sklearn digits, held in memory as uint8 arrays (loading/builtin_sets.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hypersolid_scale.data.formats import Format, register
from hypersolid_scale.data.loading.builtin_sets import load_builtin

if TYPE_CHECKING:
    import torch
    from torch.utils.data import Dataset

    from hypersolid_scale.data.augment.presets import MultiCropPreset
    from hypersolid_scale.data.config import DataConfig
    from hypersolid_scale.data.loading.protocol import TrainLoader


class BuiltinFormat(Format):
    """Batched tensor multi-crop in the main process (augment auto|tensor), or lightly's per-sample PIL
    transforms in DataLoader workers (augment=pil); data.path: Fashion-MNIST's idx directory (optional)."""

    name = "builtin"
    needs_path = False

    def train_loader(
        self, cfg: DataConfig, preset: MultiCropPreset, *, rank: int, world_size: int, seed: int, device: torch.device
    ) -> TrainLoader:
        from hypersolid_scale.data.augment.transforms import build_pil_multicrop, pil_mode
        from hypersolid_scale.data.loading.random_access import (
            ArrayPILDataset,
            InMemoryMultiCropLoader,
            MapStyleMultiCropLoader,
        )

        split = load_builtin(cfg.builtin_name(), "train", cfg.path)
        common = dict(
            rank=rank,
            world_size=world_size,
            seed=seed,
            batch_size=cfg.loader_batch(),
            max_samples=cfg.max_pretrain_samples,
        )
        if cfg.augment in ("auto", "tensor"):
            return InMemoryMultiCropLoader(split, preset, **common)  # type: ignore[arg-type]
        ds = ArrayPILDataset(split, pil_mode(preset), build_pil_multicrop(preset))
        return MapStyleMultiCropLoader(ds, num_workers=cfg.num_workers, **common)  # type: ignore[arg-type]

    def eval_dataset(self, cfg: DataConfig, preset: MultiCropPreset, split: str) -> Dataset:
        from hypersolid_scale.data.loading.eval_datasets import ArrayEvalDataset

        return ArrayEvalDataset(load_builtin(cfg.builtin_name(), split, cfg.path), preset)

    def num_classes(self, cfg: DataConfig) -> int | None:
        return 10  # both builtin datasets have ten classes


register(BuiltinFormat())
