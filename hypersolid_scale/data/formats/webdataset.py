"""data.format=webdataset: tar shards read through the webdataset library (data/webdataset/stream.py), PIL
multi-crop in DataLoader workers; evaluation reads the shards at random (data/webdataset/index.py)."""

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


@dataclass
class WebDatasetOptions:
    """The section data.webdataset.*: how the shards are shuffled and checked."""

    shuffle_buffer: int = 2000  # samples held for shuffling inside each worker
    # The conversion manifest (path or URL: pipe:, http(s), s3://...) when it is not next to local shards;
    # shards are checked against it (sample counts; sha256 with verify_shards).
    manifest: str | None = None
    verify_shards: bool = False  # also hash each shard as it streams and compare with the manifest
    # Error out when truncated/short shards lose more than this fraction of the samples a rank reads in an
    # epoch (undecodable samples are skipped, warned and counted, not limited); 1.0 never stops.
    max_lost_fraction: float = 0.01


class WebDatasetFormat(FileFormat):
    name = "webdataset"
    device_views = True
    layouts = ("{split}",)
    Options = WebDatasetOptions

    def check_options(self, options: WebDatasetOptions) -> None:
        if not 0.0 <= options.max_lost_fraction <= 1.0:
            raise ConfigError(
                "data.webdataset.max_lost_fraction must be in [0, 1] (1.0 never stops), got "
                f"{options.max_lost_fraction}"
            )

    def train_loader(
        self, cfg: DataConfig, preset: MultiCropPreset, *, rank: int, world_size: int, seed: int, device: torch.device
    ) -> Any:
        from hypersolid_scale.data.webdataset.stream import WebDatasetLoader

        assert cfg.path is not None
        opts: WebDatasetOptions = self.options(cfg)
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
            shuffle_buffer=opts.shuffle_buffer,
            num_samples=cfg.max_pretrain_samples,
            manifest=opts.manifest,
            verify_shards=opts.verify_shards,
            max_lost_fraction=opts.max_lost_fraction,
            **device_stage,
        )

    def open_eval(self, cfg: DataConfig, preset: MultiCropPreset, path: str) -> Dataset:
        from hypersolid_scale.data.transforms import build_eval_transform, pil_mode
        from hypersolid_scale.data.webdataset.index import ShardIndexDataset

        opts: WebDatasetOptions = self.options(cfg)
        return ShardIndexDataset(
            path,
            mode=pil_mode(preset),
            transform=build_eval_transform(preset),
            manifest=opts.manifest,
            verify=opts.verify_shards,
        )

    def manifest(self, cfg: DataConfig) -> dict | None:
        if manifest := self.options(cfg).manifest:  # remote shards: the one data.webdataset.manifest names
            from hypersolid_scale.data.webdataset.shards import Manifest

            return Manifest.load(manifest).data
        return super().manifest(cfg)


register(WebDatasetFormat())
