"""data.format=imagefolder: a folder with one subfolder per class (torchvision's ImageFolder), PIL
multi-crop in DataLoader workers. data.path: the folder, or a conversion output root holding imagefolder/<split>."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hypersolid_scale.data.formats import ConversionTarget, FileFormat, register
from hypersolid_scale.safety.errors import ConfigError, DataError

if TYPE_CHECKING:
    import torch
    from torch.utils.data import Dataset

    from hypersolid_scale.data.augment.presets import MultiCropPreset
    from hypersolid_scale.data.config import DataConfig
    from hypersolid_scale.data.loading.protocol import TrainLoader


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


def folder_class_name(label: int, classes: list[str]) -> str:
    """Class directory: the label number first, so that sorted directories keep the label order
    (what ImageFolder assumes), and no path separators ("T-shirt/top")."""
    width = len(str(len(classes) - 1))
    return f"{label:0{width}d}_" + "".join(c if c.isalnum() or c in "-_" else "_" for c in classes[label])


class FolderTarget(ConversionTarget):
    """The converter's ``<out>/imagefolder/<split>/<label>_<class>/<stem>_<hash>.<ext>``: one file per good image, as
    encoded for the shards; a file that exists is not written again (``--resume``)."""

    encodes = True

    def check(self, splits: dict[str, Any], unlabeled: frozenset[str] | set[str]) -> None:
        if unlabeled & set(splits):
            raise ConfigError(
                f"--formats imagefolder cannot hold the split(s) {sorted(unlabeled & set(splits))}: they "
                "have no labels and an image folder needs a class folder per image; convert them with "
                "--formats webdataset or ffcv"
            )

    def dest(self, split: str, item: Any) -> Path:
        from hypersolid_scale.data.convert.converter import hash_name

        name = f"{Path(item.name).stem}_{hash_name(item.name)}.{self.conv.ext}"
        return self.conv.out / "imagefolder" / split / folder_class_name(item.label, self.classes) / name

    def begin_split(self, split: str, classes: list[str], resumed: list[Any]) -> None:
        """Images of finished shards: written with them, unless a file went missing."""
        self.classes = classes
        for item in resumed:
            if not (dest := self.dest(split, item)).is_file():
                self.write(dest, self.conv.encode(item))

    def add(self, split: str, k: int, item: Any, data: bytes | None, pending: list[dict]) -> None:
        if not (dest := self.dest(split, item)).is_file():
            assert data is not None
            self.write(dest, data)

    @staticmethod
    def write(dest: Path, data: bytes) -> None:
        from hypersolid_scale.safety import atomic

        atomic.write_bytes(dest, data)


class ImageFolderFormat(FileFormat):
    name = "imagefolder"
    device_views = True
    layouts = ("imagefolder/{split}", "folder/{split}", "{split}")  # folder/: outputs of earlier converters
    target = FolderTarget

    def train_loader(
        self, cfg: DataConfig, preset: MultiCropPreset, *, rank: int, world_size: int, seed: int, device: torch.device
    ) -> TrainLoader:
        from hypersolid_scale.data.augment.transforms import build_pil_multicrop, pil_mode
        from hypersolid_scale.data.loading.random_access import MapStyleMultiCropLoader

        assert cfg.path is not None
        root = self.split_path(cfg.path, "train")
        stage = None
        if cfg.views_on == "device":  # the workers read bytes and draw; this process decodes and augments
            from hypersolid_scale.data.device.views import device_stages

            host, stage = device_stages(preset, cfg.jpeg_decoder, device)
            ds = image_folder(root, None, host)
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
            device_stage=stage,
        )

    def open_eval(self, cfg: DataConfig, preset: MultiCropPreset, path: str) -> Dataset:
        from hypersolid_scale.data.augment.transforms import build_eval_transform, pil_mode

        return image_folder(path, pil_mode(preset), build_eval_transform(preset))

    def num_classes(self, cfg: DataConfig) -> int | None:
        found = super().num_classes(cfg)
        if found is not None or not cfg.path:
            return found
        root = Path(self.split_path(cfg.path, "train"))  # no manifest: count the class folders
        return sum(1 for d in root.iterdir() if d.is_dir()) if root.is_dir() else None


register(ImageFolderFormat())
