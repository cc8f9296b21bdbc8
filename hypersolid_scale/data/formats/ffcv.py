"""data.format=ffcv: .beton files; decode + crop + flip in FFCV, photometric augmentations batched on the
training device (data/ffcv/). data.path: a .beton file or a conversion output root holding <split>.beton."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hypersolid_scale.data.formats import FileFormat, register

if TYPE_CHECKING:
    import torch
    from torch.utils.data import Dataset

    from hypersolid_scale.data.config import DataConfig
    from hypersolid_scale.data.presets import MultiCropPreset


class FFCVFormat(FileFormat):
    name = "ffcv"
    layouts = ("{split}.beton",)
    layout_is_file = True

    def train_loader(
        self, cfg: DataConfig, preset: MultiCropPreset, *, rank: int, world_size: int, seed: int, device: torch.device
    ) -> Any:
        from hypersolid_scale.data.ffcv.loader import FFCVLoader

        assert cfg.path is not None
        return FFCVLoader(
            self.split_path(cfg.path, "train"),
            preset,
            rank=rank,
            world_size=world_size,
            seed=seed,
            batch_size=cfg.loader_batch(),
            device=device,
            num_workers=cfg.num_workers,
            order=cfg.ffcv_order,
            os_cache=cfg.ffcv_os_cache,
            batches_ahead=cfg.ffcv_batches_ahead,
        )

    def open_eval(self, cfg: DataConfig, preset: MultiCropPreset, path: str) -> Dataset:
        from hypersolid_scale.data.ffcv.loader import ffcv_eval_dataset

        return ffcv_eval_dataset(path, preset)


register(FFCVFormat())
