"""data.format=imagefolder: a folder with one subfolder per class (torchvision's ImageFolder), PIL
multi-crop in DataLoader workers. data.path: the folder, or a conversion output root holding imagefolder/<split>."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hypersolid_scale.data.formats import FileFormat, register
from hypersolid_scale.safety.errors import DataError

if TYPE_CHECKING:
    import torch
    from torch.utils.data import Dataset

    from hypersolid_scale.data.config import DataConfig
    from hypersolid_scale.data.presets import MultiCropPreset


def image_folder(root: str, mode: str | None, transform: Callable | None) -> Dataset:
    """(transform(image), class index) of root/<class>/<image>, images converted to `mode` (None: the
    file's bytes, undecoded)."""
    from PIL import Image
    from torchvision.datasets import ImageFolder

    if not Path(root).is_dir():
        raise DataError(f"image folder {root!r} does not exist (expected one subfolder per class)")
    if mode is None:
        return ImageFolder(root, transform=transform, loader=lambda f: Path(f).read_bytes())
    return ImageFolder(root, transform=transform, loader=lambda f: Image.open(f).convert(mode))


class ImageFolderFormat(FileFormat):
    name = "imagefolder"
    device_views = True
    layouts = ("imagefolder/{split}", "folder/{split}", "{split}")  # folder/: outputs of earlier converters

    def train_loader(
        self, cfg: DataConfig, preset: MultiCropPreset, *, rank: int, world_size: int, seed: int, device: torch.device
    ) -> Any:
        from hypersolid_scale.data.loaders import MapStyleMultiCropLoader
        from hypersolid_scale.data.transforms import build_pil_multicrop, pil_mode

        assert cfg.path is not None
        root = self.split_path(cfg.path, "train")
        device_stage: dict[str, Any] = {}
        if cfg.views_on == "device":  # the workers read bytes and draw; this process decodes and augments
            from hypersolid_scale.data.device_views import DeviceStage, HostStage, collate_host

            ds = image_folder(root, None, HostStage(preset, cfg.jpeg_decoder))
            device_stage = dict(
                device_stage=DeviceStage(preset, device), collate_fn=collate_host, pin_memory=device.type == "cuda"
            )
        else:
            ds = image_folder(root, pil_mode(preset), build_pil_multicrop(preset))
        return MapStyleMultiCropLoader(
            ds,
            rank=rank,
            world_size=world_size,
            seed=seed,
            batch_size=cfg.loader_batch(),
            num_workers=cfg.num_workers,
            max_samples=cfg.max_pretrain_samples,
            **device_stage,
        )

    def open_eval(self, cfg: DataConfig, preset: MultiCropPreset, path: str) -> Dataset:
        from hypersolid_scale.data.transforms import build_eval_transform, pil_mode

        return image_folder(path, pil_mode(preset), build_eval_transform(preset))

    def num_classes(self, cfg: DataConfig) -> int | None:
        found = super().num_classes(cfg)
        if found is not None or not cfg.path:
            return found
        root = Path(self.split_path(cfg.path, "train"))  # no manifest: count the class folders
        return sum(1 for d in root.iterdir() if d.is_dir()) if root.is_dir() else None


register(ImageFolderFormat())
