"""data.format=ffcv: .beton files; decode + crop + flip in FFCV, photometric augmentations batched on the
training device (data/ffcv/). data.path: a .beton file or a conversion output root holding <split>.beton."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hypersolid_scale.data.formats import FileFormat, register
from hypersolid_scale.safety.errors import ConfigError

if TYPE_CHECKING:
    import torch
    from torch.utils.data import Dataset

    from hypersolid_scale.data.config import DataConfig
    from hypersolid_scale.data.presets import MultiCropPreset

ORDERS = ("random", "quasi_random", "sequential")


@dataclass
class FFCVOptions:
    """The section data.ffcv.*: how FFCV reads the .beton file."""

    order: str = "quasi_random"  # random | quasi_random (memory-friendly) | sequential
    os_cache: bool = False  # True: memory-map the whole file (dataset fits in RAM)
    batches_ahead: int = 3


class FFCVFormat(FileFormat):
    name = "ffcv"
    layouts = ("{split}.beton",)
    layout_is_file = True
    Options = FFCVOptions

    def check_options(self, options: FFCVOptions) -> None:
        if options.order not in ORDERS:
            raise ConfigError(f"data.ffcv.order={options.order!r} is not one of {ORDERS}")

    def train_loader(
        self, cfg: DataConfig, preset: MultiCropPreset, *, rank: int, world_size: int, seed: int, device: torch.device
    ) -> Any:
        from hypersolid_scale.data.ffcv.loader import FFCVLoader

        assert cfg.path is not None
        opts: FFCVOptions = self.options(cfg)
        return FFCVLoader(
            self.split_path(cfg.path, "train"),
            preset,
            rank=rank,
            world_size=world_size,
            seed=seed,
            batch_size=cfg.loader_batch(),
            device=device,
            num_workers=cfg.num_workers,
            order=opts.order,
            os_cache=opts.os_cache,
            batches_ahead=opts.batches_ahead,
        )

    def open_eval(self, cfg: DataConfig, preset: MultiCropPreset, path: str) -> Dataset:
        from hypersolid_scale.data.ffcv.loader import ffcv_eval_dataset

        return ffcv_eval_dataset(path, preset)


register(FFCVFormat())
