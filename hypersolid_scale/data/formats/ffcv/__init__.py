"""data.format=ffcv: .beton files (image + label); decode + crop + flip in FFCV, photometric augmentations
batched on the training device. data.path: a .beton file or a conversion output root holding <split>.beton.

This module is the format's registry entry (and the converter's `--formats ffcv` target); the folder holds the
rest, each module importing FFCV only when it runs:
- `options.py`: the section data.ffcv.* (`FFCVOptions`);
- `loader.py`: the training loader (`FFCVLoader`) and the evaluation dataset of a `.beton`;
- `crop.py`: the loader's crop + flip decoder, its draws keyed per sample;
- `beton_writer.py`: writing `.beton` files (`write_beton`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hypersolid_scale.data.formats import ConversionTarget, FileFormat, register
from hypersolid_scale.data.formats.ffcv.options import ORDERS, FFCVOptions
from hypersolid_scale.safety.errors import ConfigError

if TYPE_CHECKING:
    import torch
    from torch.utils.data import Dataset

    from hypersolid_scale.data.augment.presets import MultiCropPreset
    from hypersolid_scale.data.config import DataConfig
    from hypersolid_scale.data.loading.protocol import TrainLoader


class BetonTarget(ConversionTarget):
    """The converter's ``<out>/<split>.beton``: every good image, decoded again after the stream and stored as
    ``--ffcv-mode`` says; the page size is fixed by the largest image, read from the headers first."""

    def __init__(self, converter: Any) -> None:
        super().__init__(converter)
        self.bounds: dict[str, tuple[int, int]] = {}  # split -> (pixels, side) of its largest image

    def prepare(self, splits: dict[str, Any]) -> None:
        """The largest image of each split, from the headers, before anything is written: an image no page
        holds is refused now, not after the other outputs."""
        from tqdm import tqdm

        from hypersolid_scale.data.formats.ffcv.beton_writer import largest_image, page_size_for

        conv = self.conv
        for split, items in splits.items():
            headers = (it.load for it in tqdm(items, desc=f"image sizes {split}", unit="img"))
            bounds = (conv.resize**2, conv.resize) if conv.resize else largest_image(headers, conv.max_side)
            page_size_for(*bounds)
            self.bounds[split] = bounds

    def end_split(self, split: str, good: list[Any], consumed: int, pending: list[dict]) -> dict[str, Any]:
        from hypersolid_scale.data.formats.ffcv.beton_writer import write_beton
        from hypersolid_scale.data.loading.common import sha256

        conv = self.conv
        dest = conv.out / f"{split}.beton"
        pixels, side = self.bounds[split]
        workers = {} if conv.beton_workers is None else {"num_workers": conv.beton_workers}
        write_beton(
            str(dest),
            [conv.rgb(it) for it in good],
            [it.label for it in good],
            write_mode=conv.ffcv_mode,
            jpeg_quality=conv.quality,
            max_pixels=pixels,
            max_side=side,
            **workers,
        )
        digest = {"sha256": sha256(dest)} if conv.hash_outputs else {}
        return {"beton": {"name": dest.name, "count": len(good), **digest, "bytes": dest.stat().st_size}}


class FFCVFormat(FileFormat):
    name = "ffcv"
    layouts = ("{split}.beton",)
    layout_is_file = True
    Options = FFCVOptions
    target = BetonTarget

    def check_options(self, options: FFCVOptions) -> None:
        if options.order not in ORDERS:
            raise ConfigError(f"data.ffcv.order={options.order!r} is not one of {ORDERS}")

    def train_loader(
        self, cfg: DataConfig, preset: MultiCropPreset, *, rank: int, world_size: int, seed: int, device: torch.device
    ) -> TrainLoader:
        from hypersolid_scale.data.formats.ffcv.loader import FFCVLoader

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
        from hypersolid_scale.data.formats.ffcv.loader import ffcv_eval_dataset

        return ffcv_eval_dataset(path, preset)


register(FFCVFormat())
