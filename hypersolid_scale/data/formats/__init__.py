"""The registry of storage formats (data.format): how each builds its training loader and evaluation data.

Every module of this package defines one `Format` subclass and registers an instance with `register`;
`get` and `names` import them all on first use (``python -m hypersolid_scale.data.formats`` lists them). A
new format is one new module here (plus its tests). A format's own keys are its ``Options`` dataclass, the
config section ``data.<name>.*`` (``DataConfig`` has one per format that declares them, read and checked only
when it is the chosen format).
Modules here stay cheap to import: torch, webdataset or FFCV are imported inside the methods that need
them, so validating a config or running the converter does not load them.

File formats (`FileFormat`) share one rule for where a split lives: a conversion output root holds its
splits at the format's `layouts` (e.g. `<root>/train/` shards, `<root>/train.beton`); a `data.path` that
is not such a root is the split itself, and the held-out split is looked for inside the root, then next
to the split (`<root>/<split>` and `<root>/test`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from hypersolid_scale.config.registry import DEFAULT_ORDER, Registry
from hypersolid_scale.data.loading.common import find_manifest
from hypersolid_scale.safety.errors import ConfigError

if TYPE_CHECKING:
    import torch
    from torch.utils.data import Dataset

    from hypersolid_scale.data.augment.presets import MultiCropPreset
    from hypersolid_scale.data.config import DataConfig
    from hypersolid_scale.data.loading.protocol import TrainLoader

SPLITS = ("train", "test")


class ConversionTarget:
    """What the converter writes for one format (``python -m hypersolid_scale.data.convert --formats NAME``),
    one instance per conversion, made by ``Format.target(converter)``. The converter (data/convert/converter.py, the
    shared wiring) streams each split's images once, decodes and checks each, encodes each good one once,
    lists the bad ones, and calls every target in ``--formats`` order:

    ``check(splits, unlabeled)``: refuse, before anything is written, what this format cannot hold;
    ``prepare(splits)``: read what must be known before writing (FFCV's page size: the largest image);
    per split: ``resume_records(split)`` (a target that records its finished parts for ``--resume``: those
    records, each with the source items it ``consumed`` and the ``bad`` files among them; else None),
    ``begin_split`` (with the good items an earlier run already converted), ``add`` per good item while they
    stream (``data``: its encoded bytes, when a target ``encodes``; ``pending``: the bad files since the last
    recorded part), ``end_split`` -> this format's keys of the split's manifest entry; ``abort()`` when the
    conversion is interrupted.
    """

    encodes: bool = False  # it needs each good image's encoded bytes while the images stream

    def __init__(self, converter: Any) -> None:
        self.conv = converter

    def check(self, splits: dict[str, Any], unlabeled: frozenset[str] | set[str]) -> None:
        """Raise ConfigError for a split this format cannot hold."""

    def prepare(self, splits: dict[str, Any]) -> None:
        """Before anything is written."""

    def resume_records(self, split: str) -> list[dict] | None:
        return None

    def begin_split(self, split: str, classes: list[str], resumed: list[Any]) -> None:
        """``resumed``: the good items of ``split`` that an interrupted run already converted."""

    def add(self, split: str, k: int, item: Any, data: bytes | None, pending: list[dict]) -> None:
        """Item ``k`` of ``split``, good."""

    def end_split(self, split: str, good: list[Any], consumed: int, pending: list[dict]) -> dict[str, Any]:
        return {}

    def abort(self) -> None:
        """The conversion stopped mid-split: leave nothing half-written."""


class Format:
    """A storage format: subclasses implement `train_loader`, `eval_dataset` and `num_classes`."""

    name: str = ""
    needs_path: bool = True  # data.path is required
    order: int = DEFAULT_ORDER  # place in names() (then by name): the default, builtin, comes first
    # The dataclass of this format's own keys, the config section data.<name>.* (None: it has none).
    Options: type | None = None
    # Its images can be decoded and cropped into views on the training device (data.views_on=device: the
    # loader hands over encoded images, data/device/views.py); a format that decodes in a pipeline of its own
    # (FFCV) or holds decoded tensors in memory (builtin) does not.
    device_views: bool = False
    # What ``python -m hypersolid_scale.data.convert --formats <name>`` writes for it; None: not a conversion
    # output (builtin).
    target: type[ConversionTarget] | None = None

    def options(self, cfg: DataConfig) -> Any:
        """This format's section of `cfg` (``data.<name>``, an ``Options``)."""
        return getattr(cfg, self.name)

    def check_options(self, options: Any) -> None:
        """Raise ConfigError naming the first bad ``data.<name>.<key>`` of this format's section."""

    def train_loader(
        self, cfg: DataConfig, preset: MultiCropPreset, *, rank: int, world_size: int, seed: int, device: torch.device
    ) -> TrainLoader:
        """An iterable of `(views, labels)` batches a `TrainLoader` (data/loading/protocol.py)."""
        raise NotImplementedError

    def eval_dataset(self, cfg: DataConfig, preset: MultiCropPreset, split: str) -> Dataset:
        """(image (C, H, W) float normalised, int label) items of `split` ("train" or "test")."""
        raise NotImplementedError

    def num_classes(self, cfg: DataConfig) -> int | None:
        """The number of classes, or None when the data does not tell."""
        raise NotImplementedError


class FileFormat(Format):
    """A format read from files under data.path: implements the split rule on top of `open_eval`."""

    # Where split S lives inside a conversion output root, tried in order ("{split}" is replaced by S).
    layouts: tuple[str, ...] = ("{split}",)
    layout_is_file = False  # a split is a file (FFCV's .beton), not a directory

    def open_eval(self, cfg: DataConfig, preset: MultiCropPreset, path: str) -> Dataset:
        """The evaluation dataset of the split at `path`."""
        raise NotImplementedError

    def _exists(self, p: Path) -> bool:
        return p.is_file() if self.layout_is_file else p.is_dir()

    def in_root(self, path: str, split: str) -> str | None:
        """`split` inside a conversion output root at `path`, or None when `path` holds no such split."""
        for layout in self.layouts:
            cand = Path(path) / layout.format(split=split)
            if self._exists(cand):
                return str(cand)
        return None

    def split_path(self, path: str, split: str) -> str:
        """`split` of a conversion output root, else `path` itself (data.path is the split)."""
        return self.in_root(path, split) or path

    def sibling(self, path: str, split: str) -> str | None:
        """`split` next to the split at `path` (`<root>/train` -> `<root>/test`), if it exists."""
        p = Path(path)
        cand = p.parent / self.layouts[-1].format(split=split)
        return str(cand) if self._exists(cand) and cand.resolve() != p.resolve() else None

    def test_path(self, cfg: DataConfig) -> str:
        if cfg.test_path:
            return cfg.test_path
        assert cfg.path is not None
        found = self.in_root(cfg.path, "test") or self.sibling(cfg.path, "test")
        if found is None:
            raise ConfigError(
                f"no held-out split found next to data.path={cfg.path!r}: set data.test_path, or "
                "data.eval_split=holdout to carve one out of the training data"
            )
        return found

    def eval_train_path(self, cfg: DataConfig) -> str:
        """The labelled data evaluation trains on: data.eval_train_path, else the training split, else (when
        the manifest marks the training split as unlabelled) the labelled `train` split next to it."""
        if cfg.eval_train_path:
            return cfg.eval_train_path
        assert cfg.path is not None
        path = self.split_path(cfg.path, "train")
        if not is_unlabeled(path):
            return path
        labelled = self.sibling(path, "train")
        if labelled is None or is_unlabeled(labelled):
            raise ConfigError(
                f"data.path={cfg.path!r} holds no labels (the conversion manifest says so) and no "
                "labelled 'train' split lies next to it: set data.eval_train_path to labelled data "
                "of the same dataset for evaluation"
            )
        return labelled

    def eval_dataset(self, cfg: DataConfig, preset: MultiCropPreset, split: str) -> Dataset:
        return self.open_eval(cfg, preset, self.eval_train_path(cfg) if split == "train" else self.test_path(cfg))

    def manifest(self, cfg: DataConfig) -> dict | None:
        return find_manifest(cfg.path)

    def num_classes(self, cfg: DataConfig) -> int | None:
        manifest = self.manifest(cfg)
        return int(manifest["num_classes"]) if manifest is not None and "num_classes" in manifest else None


def is_unlabeled(path: str) -> bool:
    """True when the conversion manifest above `path` marks the split at `path` as having no labels."""
    manifest = find_manifest(path)
    if manifest is None:
        return False
    name = Path(path).name.split(".")[0]  # "unlabeled" or "unlabeled.beton"
    return manifest.get("splits", {}).get(name, {}).get("labeled", True) is False


FORMATS: Registry[Format] = Registry("format", "data.format", "hypersolid_scale.data.formats")


def register(fmt: Format) -> Format:
    """Register the format instance ``fmt`` under its ``name``."""
    return FORMATS.register(fmt.name, fmt)


def unregister(name: str) -> None:
    """Remove a registered format (tests that register one of their own)."""
    FORMATS.unregister(name)


def names() -> tuple[str, ...]:
    """The registered formats, "builtin" (the default) first, then by name."""
    return FORMATS.names()


def get(name: str) -> Format:
    """The format registered as ``name``; a ConfigError listing the known names otherwise."""
    return FORMATS.get(name)


def with_options() -> dict[str, type]:
    """{name: Options} of the registered formats that declare their own keys, in ``names()`` order."""
    return {n: opts for n in names() if (opts := get(n).Options) is not None}


def device_view_formats() -> list[str]:
    """The registered formats whose images the device stage can decode into views (``Format.device_views``)."""
    return [n for n in names() if get(n).device_views]


def conversion_formats() -> list[str]:
    """The registered formats the converter can write (``Format.target``)."""
    return [n for n in names() if get(n).target is not None]


def file_formats() -> list[str]:
    """The registered formats read from files under data.path (``Format.needs_path``)."""
    return [n for n in names() if get(n).needs_path]
