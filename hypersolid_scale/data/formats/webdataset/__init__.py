"""data.format=webdataset: tar shards of (image, class) samples read through the webdataset library, PIL
multi-crop in DataLoader workers; evaluation reads the shards at random.

This module is the format's registry entry (and the converter's `--formats webdataset` target); the folder holds
the rest, each module importing only what it needs:
- `stream.py`: the training loader (`WebDatasetLoader`): shards streamed through the webdataset library into
  multi-crop batches, split by rank and by worker, one DataLoader for the whole run;
- `rank_streams.py`: what each DataLoader worker reads and decodes, epoch after epoch (`ShardStream`);
- `index.py`: random access into shards for evaluation (`ShardIndexDataset`);
- `shards.py`: the conversion manifest, and reading one shard with its integrity checks;
- `urls.py`: the shard URLs data.path names, and opening one as a byte stream;
- `shard_writer.py`: writing shards (`ShardWriter`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hypersolid_scale.data.formats import ConversionTarget, FileFormat, register
from hypersolid_scale.safety.errors import ConfigError

if TYPE_CHECKING:
    import torch
    from torch.utils.data import Dataset

    from hypersolid_scale.data.augment.presets import MultiCropPreset
    from hypersolid_scale.data.config import DataConfig
    from hypersolid_scale.data.loading.protocol import TrainLoader


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


def sample_key(name: str) -> str:
    """A sample's key in the shards: the source file's stem and a short hash of its name (file stems repeat
    across classes). No dots: WebDataset splits "<key>.<ext>" at the first dot."""
    from hypersolid_scale.data.convert.converter import hash_name

    return f"{Path(name).stem.replace('.', '_')}_{hash_name(name)}"


class ShardTarget(ConversionTarget):
    """The converter's shards: ``<out>/<split>/shard-000000.tar`` ..., ``--shard-size`` samples each, every finished
    shard recorded (sha256, the items it consumed, the bad files among them) in ``<out>/.progress.json`` so that
    ``--resume`` starts after the last intact one."""

    encodes = True

    def __init__(self, converter: Any) -> None:
        super().__init__(converter)
        self.writer: Any = None  # the shard being written
        self.done: list[dict] = []  # the split's finished shards

    def resume_records(self, split: str) -> list[dict]:
        """The recorded shards of ``split`` up to the first missing or changed one (those get rewritten)."""
        from hypersolid_scale.data.loading.common import sha256

        d = self.conv.out / split
        done: list[dict] = self.conv.progress.setdefault(split, [])
        intact = 0
        while (
            intact < len(done)
            and (d / done[intact]["name"]).is_file()
            and sha256(d / done[intact]["name"]) == done[intact]["sha256"]
        ):
            intact += 1
        del done[intact:]
        self.writer, self.done = None, done
        return done

    def begin_split(self, split: str, classes: list[str], resumed: list[Any]) -> None:
        (self.conv.out / split).mkdir(exist_ok=True)

    def add(self, split: str, k: int, item: Any, data: bytes | None, pending: list[dict]) -> None:
        from hypersolid_scale.data.formats.webdataset.shard_writer import ShardWriter

        if self.writer is None:
            self.writer = ShardWriter(self.conv.out / split / f"shard-{len(self.done):06d}.tar")
        assert data is not None
        self.writer.add(sample_key(item.name), {self.conv.ext: data, "cls": str(item.label).encode()})
        if self.writer.count == self.conv.shard_size:
            self.finish_shard(k + 1, pending)

    def finish_shard(self, consumed: int, pending: list[dict]) -> None:
        """Close the current shard and record it, with how far into the items it reached and the bad files
        met since the previous shard (what --resume needs to skip them without decoding)."""
        self.done.append({**self.writer.close(), "consumed": consumed, "bad": list(pending)})
        self.writer = None
        pending.clear()
        self.conv.save_progress()

    def end_split(self, split: str, good: list[Any], consumed: int, pending: list[dict]) -> dict[str, Any]:
        if self.writer is not None:
            self.finish_shard(consumed, pending)
        return {"shards": [{key: d[key] for key in ("name", "count", "sha256")} for d in self.done]}

    def abort(self) -> None:
        """The unfinished shard goes; finished ones and their record stay."""
        if self.writer is not None:
            self.writer.abort()


class WebDatasetFormat(FileFormat):
    name = "webdataset"
    device_views = True
    layouts = ("{split}",)
    Options = WebDatasetOptions
    target = ShardTarget

    def check_options(self, options: WebDatasetOptions) -> None:
        if not 0.0 <= options.max_lost_fraction <= 1.0:
            raise ConfigError(
                "data.webdataset.max_lost_fraction must be in [0, 1] (1.0 never stops), got "
                f"{options.max_lost_fraction}"
            )

    def train_loader(
        self, cfg: DataConfig, preset: MultiCropPreset, *, rank: int, world_size: int, seed: int, device: torch.device
    ) -> TrainLoader:
        from hypersolid_scale.data.formats.webdataset.stream import WebDatasetLoader

        assert cfg.path is not None
        opts: WebDatasetOptions = self.options(cfg)
        device_stage: dict[str, Any] = {}
        if cfg.views_on == "device":  # the workers read bytes and draw; this process decodes and augments
            from hypersolid_scale.data.device.views import device_stages

            host, stage = device_stages(preset, cfg.jpeg_decoder, device)
            device_stage = dict(transform=host, device_stage=stage)
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
        from hypersolid_scale.data.augment.transforms import build_eval_transform, pil_mode
        from hypersolid_scale.data.formats.webdataset.index import ShardIndexDataset

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
            from hypersolid_scale.data.formats.webdataset.shards import Manifest

            return Manifest.load(manifest).data
        return super().manifest(cfg)


register(WebDatasetFormat())
