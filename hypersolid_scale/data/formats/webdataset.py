"""data.format=webdataset: tar shards read through the webdataset library (data/webdataset/stream.py), PIL
multi-crop in DataLoader workers; evaluation reads the shards at random (data/webdataset/index.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hypersolid_scale.data.formats import FileFormat, register

if TYPE_CHECKING:
    import torch
    from torch.utils.data import Dataset

    from hypersolid_scale.data.config import DataConfig
    from hypersolid_scale.data.presets import MultiCropPreset


class WebDatasetFormat(FileFormat):
    name = "webdataset"
    layouts = ("{split}",)

    def train_loader(
        self, cfg: DataConfig, preset: MultiCropPreset, *, rank: int, world_size: int, seed: int, device: torch.device
    ) -> Any:
        from hypersolid_scale.data.webdataset.stream import WebDatasetLoader

        assert cfg.path is not None
        device_stage: dict[str, Any] = {}
        if cfg.views_on == "device":  # the workers read bytes and draw; this process decodes and augments
            from hypersolid_scale.data.device_views import DeviceStage, HostStage

            device_stage = dict(transform=HostStage(preset, cfg.jpeg_decoder), device_stage=DeviceStage(preset, device))
        return WebDatasetLoader(
            self.split_path(cfg.path, "train"),
            preset,
            rank=rank,
            world_size=world_size,
            seed=seed,
            batch_size=cfg.loader_batch(),
            num_workers=cfg.num_workers,
            shuffle_buffer=cfg.shuffle_buffer,
            num_samples=cfg.max_pretrain_samples,
            manifest=cfg.manifest,
            verify_shards=cfg.verify_shards,
            max_lost_fraction=cfg.max_lost_fraction,
            **device_stage,
        )

    def open_eval(self, cfg: DataConfig, preset: MultiCropPreset, path: str) -> Dataset:
        from hypersolid_scale.data.transforms import build_eval_transform, pil_mode
        from hypersolid_scale.data.webdataset.index import ShardIndexDataset

        return ShardIndexDataset(
            path,
            mode=pil_mode(preset),
            transform=build_eval_transform(preset),
            manifest=cfg.manifest,
            verify=cfg.verify_shards,
        )

    def manifest(self, cfg: DataConfig) -> dict | None:
        if cfg.manifest:  # remote shards: the manifest named by data.manifest
            from hypersolid_scale.data.webdataset.shards import Manifest

            return Manifest.load(cfg.manifest).data
        return super().manifest(cfg)


register(WebDatasetFormat())
