"""`DataConfig`: which data, which multi-crop preset, how it is loaded.

The trainer nests this dataclass under ``cfg.data`` (OmegaConf structured config), so every field is a
plain type and ``None`` means "take the preset's / dataset's default".

The keys every format shares are `DataConfigBase`'s. Each registered format that declares its own keys (its
``Options`` dataclass, in its module under data/formats/) adds the section ``data.<format>.*``: `DataConfig` is
built from the registry, as the ``method`` section is from the methods' (a new format file adds its section).
Only the chosen format's section is checked (by the format), enters the fingerprint and is stored with a
checkpoint (`chosen_format_section`); a stored section of a format not installed here is left out, said in
one line (`drop_missing_format_sections`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from hypersolid_scale.config.sections import chosen_only, drop_missing
from hypersolid_scale.data import formats
from hypersolid_scale.data.loading.builtin_sets import BUILTIN_DATASETS
from hypersolid_scale.safety.errors import ConfigError

AUGMENT_MODES = ("auto", "pil", "tensor")
VIEWS_ON = ("workers", "device")  # the values of data.views_on: where the multi-crop views are made
JPEG_DECODERS = ("device", "workers")
EVAL_SPLITS = ("test", "holdout")
DEFAULT_BATCH_SIZE_PER_GPU = 256  # when a config states neither batch key
DEFAULT_FORMAT = "builtin"


@dataclass
class DataConfigBase:
    """The keys of ``data.*`` every format shares; `DataConfig` adds one section per format with options."""

    # The formats that have a section (data.<format>.*), set on DataConfig.
    format_sections: ClassVar[tuple[str, ...]] = ()

    # --- what ---------------------------------------------------------------------------------------
    # How the data is stored: "builtin" (a dataset this package loads into memory itself), "webdataset"
    # (tar shards), "ffcv" (.beton files) or "imagefolder" (one subfolder per class).
    format: str = DEFAULT_FORMAT
    # The dataset's name. builtin: "fashion_mnist" (the default) | "digits". File formats: an optional free
    # name (e.g. "cifar10", "stl10", "imagenet1k") that picks the multi-crop preset when preset=auto.
    dataset: str | None = None
    # Training data. webdataset: a shard directory, a conversion output root holding train/, or brace
    # patterns of paths or URLs ("d/shard-{000000..000009}.tar", "https://host/train/shard-{0..9}.tar",
    # "pipe:aws s3 cp s3://bucket/train/shard-{000000..000099}.tar -", s3:// and gs:// with fsspec);
    # ffcv: a .beton file or a root holding train.beton; imagefolder: a folder with one subfolder per
    # class (or a root holding train/);
    # fashion_mnist: a directory with the four idx files (default: Debian's dataset-fashion-mnist).
    path: str | None = None
    # Held-out data of the same kind as `path` (default: the `test` split next to `path`).
    test_path: str | None = None
    # Labelled data of the same kind as `path` that evaluation (kNN monitor, linear probe) trains on.
    # Default: the `train` split of `path`; when `path` is a split the conversion manifest marks as
    # unlabelled (e.g. STL-10's "unlabeled"), the labelled `train` split next to it.
    eval_train_path: str | None = None
    # "test": evaluate on the test split; "holdout": carve `holdout_fraction` out of the training split
    # (deterministic, by index) when a dataset has no test split.
    eval_split: str = "test"
    holdout_fraction: float = 0.1
    # None: read from the manifest written by `python -m hypersolid_scale.data.convert` (or count classes).
    num_classes: int | None = None
    # Cap on the pre-training samples (quick runs and tests); None = all. (Formerly data.max_train_samples, still
    # read: eval.max_train_samples caps the evaluation's training split.)
    max_pretrain_samples: int | None = None

    # --- multi-crop ---------------------------------------------------------------------------------
    # "auto" picks the preset named like data.dataset (fashion_mnist, digits, cifar10, cifar100, stl10,
    # food101, imagenet; imagenet1k and imagenet100 -> imagenet), else "default".
    preset: str = "auto"
    num_local_views: int | None = None
    global_crop_size: int | None = None
    local_crop_size: int | None = None
    global_crop_scale: list[float] | None = None
    local_crop_scale: list[float] | None = None
    # "pil": lightly's DINOTransform per sample (the reference semantics); "tensor": the batched torch
    # implementation of the same augmentations (fast path for in-memory builtin datasets);
    # "auto": tensor for the builtin format, pil for webdataset/imagefolder. FFCV always decodes + crops in
    # FFCV and applies the photometric augmentations batched on the training device.
    augment: str = "auto"
    # webdataset/imagefolder: where the multi-crop views are made (formerly data.decode, still read).
    # "workers": PIL decode + the PIL multi-crop in DataLoader workers. "device": the workers read the bytes
    # and draw each view's parameters (the PIL path's own draws); each JPEG is decoded once, every view is
    # cut from it and the photometric augmentations run batched on the training device (data/device/views.py,
    # docs/design.md §3e).
    views_on: str = "workers"
    # views_on=device: where JPEGs are decoded: "device" (nvJPEG on CUDA; torchvision.io.decode_jpeg) or
    # "workers" (libjpeg-turbo in the DataLoader workers; the crops still run on the device).
    jpeg_decoder: str = "device"

    # --- loading ------------------------------------------------------------------------------------
    # The batch, stated ONE way (hypersolid_scale/data/batch.py): the global batch (images per optimizer
    # step over all processes; the per-GPU batch is global / (world size x optim.accumulate_steps)), or the
    # images per GPU per forward pass (the global batch then grows with the GPU count). Neither: 256 per GPU.
    global_batch_size: int | None = None
    batch_size_per_gpu: int | None = None
    num_workers: int = 2
    # Added to the trainer's seed: changes the augmentation/order stream without touching model init.
    seed_offset: int = 0
    # Then one section per format with options: data.webdataset.* (shuffle_buffer, manifest, verify_shards,
    # max_lost_fraction), data.ffcv.* (order, os_cache, batches_ahead); see each format's module.

    def format_options(self) -> Any:
        """The chosen format's own section (``data.<format>``, its ``Options``); None when it has none."""
        return getattr(self, self.format) if self.format in self.format_sections else None

    def loader_batch(self) -> int:
        """The rows of every batch a training loader yields: ``batch_size_per_gpu`` once ``build_train_loader``
        has resolved the split (data/batch.py)."""
        if self.batch_size_per_gpu is None:
            raise ValueError("the batch is not resolved: build training loaders with build_train_loader")
        return self.batch_size_per_gpu

    def builtin_name(self) -> str:
        """The builtin dataset this config names (fashion_mnist when data.dataset is unset)."""
        return self.dataset or "fashion_mnist"

    def describe(self) -> str:
        """How messages and reports name the data: ``data.format=builtin data.dataset=fashion_mnist``."""
        name = self.builtin_name() if self.format == "builtin" else self.dataset
        return f"data.format={self.format}" + (f" data.dataset={name}" if name else "")

    def validate(self) -> None:
        """Raise ConfigError naming the bad field and the allowed values (the chosen format checks its section)."""
        # Formats are registered by their modules in hypersolid_scale/data/formats/.
        if self.dataset in formats.names() and self.dataset != "builtin":  # what data.dataset used to mean
            raise ConfigError(
                f"data.dataset={self.dataset!r} names a storage format: set "
                f"data.format={self.dataset} (data.dataset is the dataset's name, e.g. cifar10)"
            )
        if self.format not in formats.names():
            raise ConfigError(f"data.format={self.format!r} is not one of {formats.names()}")
        if self.format == "builtin" and self.builtin_name() not in BUILTIN_DATASETS:
            raise ConfigError(
                f"data.dataset={self.dataset!r} is not a builtin dataset {BUILTIN_DATASETS}; for other data "
                "convert it (python -m hypersolid_scale.data.convert --help) and set data.format to one of "
                f"{' | '.join(formats.file_formats())} and data.path"
            )
        checks = (
            (self.augment in AUGMENT_MODES, f"data.augment={self.augment!r} is not one of {AUGMENT_MODES}"),
            (self.views_on in VIEWS_ON, f"data.views_on={self.views_on!r} is not one of {VIEWS_ON}"),
            (
                self.jpeg_decoder in JPEG_DECODERS,
                f"data.jpeg_decoder={self.jpeg_decoder!r} is not one of {JPEG_DECODERS}",
            ),
            (
                self.views_on == "workers" or self.format in formats.device_view_formats(),
                (
                    f"data.views_on=device is for the formats {tuple(formats.device_view_formats())}, not data.format="
                    f"{self.format} (builtin augments batched in memory; ffcv decodes in its own pipeline): "
                    "drop data.views_on"
                ),
            ),
            (
                self.views_on == "workers" or self.augment in ("auto", "pil"),
                (
                    f"data.views_on=device reproduces the PIL path's augmentations; data.augment={self.augment!r} "
                    "does not go with it: drop data.augment"
                ),
            ),
            (self.eval_split in EVAL_SPLITS, f"data.eval_split={self.eval_split!r} is not one of {EVAL_SPLITS}"),
            (
                self.batch_size_per_gpu is None or self.batch_size_per_gpu >= 1,
                f"data.batch_size_per_gpu must be >= 1, got {self.batch_size_per_gpu}",
            ),
            (
                self.global_batch_size is None or self.global_batch_size >= 1,
                f"data.global_batch_size must be >= 1, got {self.global_batch_size}",
            ),
            (
                self.global_batch_size is None or self.batch_size_per_gpu is None,
                (
                    f"data.global_batch_size={self.global_batch_size} and data.batch_size_per_gpu="
                    f"{self.batch_size_per_gpu} are both set: state the batch one way (global_batch_size, which "
                    "stays the same on any GPU count, or batch_size_per_gpu); drop the other"
                ),
            ),
            (self.num_workers >= 0, f"data.num_workers must be >= 0, got {self.num_workers}"),
            (
                0.0 < self.holdout_fraction < 1.0,
                f"data.holdout_fraction must be in (0, 1), got {self.holdout_fraction}",
            ),
            (
                self.num_local_views is None or self.num_local_views >= 0,
                f"data.num_local_views must be >= 0, got {self.num_local_views}",
            ),
        )
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        for name in ("global_crop_scale", "local_crop_scale"):
            scale = getattr(self, name)
            if scale is not None and (len(scale) != 2 or not 0.0 < scale[0] <= scale[1] <= 1.0):
                raise ConfigError(f"data.{name} must be [min, max] with 0 < min <= max <= 1, got {scale}")
        if formats.get(self.format).needs_path and not self.path:
            raise ConfigError(
                f"data.format={self.format!r} needs data.path (convert images first: "
                "python -m hypersolid_scale.data.convert --help)"
            )
        if (options := self.format_options()) is not None:
            formats.get(self.format).check_options(options)


def _data_config_class() -> type:
    """`DataConfigBase` plus the field ``<format>: Options`` of every registered format that declares them."""
    sections = formats.with_options()
    common = {f.name for f in dataclasses.fields(DataConfigBase)}
    if clash := sorted(common & set(sections)):
        raise ConfigError(f"format names {clash} are keys of the data section; rename the formats")
    fields = [(name, opts, dataclasses.field(default_factory=opts)) for name, opts in sections.items()]
    cls = dataclasses.make_dataclass(
        "DataConfig", fields, bases=(DataConfigBase,), namespace={"format_sections": tuple(sections)}
    )
    cls.__module__ = __name__  # picklable, and named where it is defined
    cls.__doc__ = "The ``data`` section: the keys every format shares and one section per format with options."
    return cls


if TYPE_CHECKING:

    class DataConfig(DataConfigBase):
        """Statically the shared keys; at run time also one section per format (``data.<format>.*``)."""

else:
    DataConfig = _data_config_class()


def chosen_format_section(data: dict[str, Any]) -> dict[str, Any]:
    """A ``data`` section (a nested dict) with only the chosen format's own section (what a checkpoint stores)."""
    return chosen_only(data, "format", DEFAULT_FORMAT, DataConfig.format_sections)


def drop_missing_format_sections(d: dict[str, Any], where: str) -> dict[str, Any]:
    """``d`` (a stored nested config dict) without the ``data.<name>`` sections of formats not installed here
    (config/sections.py)."""
    return drop_missing(d, where, "data", "formats", {f.name for f in dataclasses.fields(DataConfig)})
