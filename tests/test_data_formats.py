"""data.format vs data.dataset, the registry of formats, where each format finds its splits."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hypersolid_scale.config.schema import load_config
from hypersolid_scale.data import (
    DataConfig,
    build_eval_datasets,
    build_train_loader,
    formats,
    in_channels,
    num_classes,
    resolve_preset,
)
from hypersolid_scale.data.formats.ffcv import FFCVOptions
from hypersolid_scale.data.formats.webdataset import WebDatasetOptions
from hypersolid_scale.safety.errors import ConfigError

CPU = torch.device("cpu")


@pytest.mark.parametrize("fmt", ["webdataset", "ffcv", "imagefolder"])
def test_a_format_in_data_dataset_says_to_set_data_format(fmt: str) -> None:
    with pytest.raises(ConfigError, match=rf"set data.format={fmt} \(data.dataset is the dataset's name"):
        DataConfig(dataset=fmt, path="data/x").validate()
    # In a config or an override it is what data.dataset used to mean: read as data.format, with a note said
    # once per process (config/former_keys.py; tests/test_former_keys.py checks the note).
    cfg = load_config(None, [f"data.dataset={fmt}", "data.path=data/x"])
    assert (cfg.data.format, cfg.data.dataset) == (fmt, None)
    # The same data under the new keys is accepted; the dataset's name is free for file formats.
    load_config(None, [f"data.format={fmt}", "data.dataset=my_photos", "data.path=data/x"])


def test_format_and_dataset_are_checked() -> None:
    names = formats.names()
    folder = Path(formats.__file__).parent  # one entry per format: a module, or a folder's __init__.py
    modules = {p.stem for p in folder.glob("[!_]*.py")} | {p.parent.name for p in folder.glob("[!_]*/__init__.py")}
    assert names[0] == "builtin" == DataConfig().format and set(names) == modules
    with pytest.raises(ConfigError, match=r"data.format='parquet' is not one of \('builtin', 'ffcv'"):
        DataConfig(format="parquet").validate()
    with pytest.raises(ConfigError, match=r"data.dataset='cifar10' is not a builtin dataset.*data.format to one of .*webdataset"):
        DataConfig(dataset="cifar10").validate()
    with pytest.raises(ConfigError, match="data.format='webdataset' needs data.path"):
        DataConfig(format="webdataset", dataset="cifar10").validate()
    DataConfig().validate()  # builtin Fashion-MNIST, no path needed
    DataConfig(dataset="digits").validate()


def test_each_format_s_options_are_its_own_section() -> None:
    """data.<format>.* comes from the format's Options (data/formats/<format>.py); only the chosen one is read."""
    sections = {n: formats.get(n).Options for n in formats.names() if formats.get(n).Options is not None}
    assert sections == {"ffcv": FFCVOptions, "webdataset": WebDatasetOptions} == formats.with_options()
    assert DataConfig.format_sections == ("ffcv", "webdataset") and DataConfig.__name__ == "DataConfig"
    cfg = DataConfig(format="webdataset", path="x", webdataset=WebDatasetOptions(shuffle_buffer=256))
    assert cfg.format_options() == WebDatasetOptions(shuffle_buffer=256) and cfg.ffcv == FFCVOptions()
    assert DataConfig().format_options() is None and pickle.loads(pickle.dumps(cfg)) == cfg
    # The chosen format checks its section, with the key's path; another format's section is not read.
    with pytest.raises(ConfigError, match=r"data.ffcv.order='shuffled' is not one of \('random'"):
        DataConfig(format="ffcv", path="x", ffcv=FFCVOptions(order="shuffled")).validate()
    DataConfig(format="webdataset", path="x", ffcv=FFCVOptions(order="shuffled")).validate()
    with pytest.raises(ConfigError, match=r"data.webdataset.max_lost_fraction must be in \[0, 1\]"):
        load_config(None, ["data.format=webdataset", "data.path=x", "data.webdataset.max_lost_fraction=2"])
    assert load_config(None, ["data.ffcv.order=random"]).data.ffcv.order == "random"


@pytest.mark.parametrize("fmt, dataset, preset", [
    ("builtin", None, "fashion_mnist"), ("builtin", "digits", "digits"), ("webdataset", None, "default"),
    ("webdataset", "cifar100", "cifar100"), ("ffcv", "ImageNet1k", "imagenet"), ("imagefolder", "stl10", "stl10"),
    ("webdataset", "my_photos", "default"), ("webdataset", "fashion_mnist", "fashion_mnist"),
])
def test_preset_auto_follows_the_dataset_name(fmt: str, dataset: str | None, preset: str) -> None:
    cfg = DataConfig(format=fmt, dataset=dataset, path=None if fmt == "builtin" else "x")
    assert resolve_preset(cfg).name == preset
    assert resolve_preset(DataConfig(format=fmt, dataset=dataset, path="x", preset="cifar")).name == "cifar"


def test_split_rules_of_the_file_formats(tmp_path: Path) -> None:
    """Reference: the layouts the converter writes (OUT/<split>/, OUT/<split>.beton, OUT/imagefolder/<split>/)."""
    root = tmp_path / "out"
    for d in ("train", "test", "imagefolder/train", "imagefolder/test"):
        (root / d).mkdir(parents=True)
    for f in ("train.beton", "test.beton"):
        (root / f).write_bytes(b"")
    wds, ffcv, folder = (formats.get(n) for n in ("webdataset", "ffcv", "imagefolder"))
    r = str(root)
    assert (wds.split_path(r, "train"), ffcv.split_path(r, "train"), folder.split_path(r, "train")) == \
        (f"{r}/train", f"{r}/train.beton", f"{r}/imagefolder/train")
    # data.path naming the split itself: it is the training data; the held-out split is its sibling.
    for fmt, split, held_out in ((wds, f"{r}/train", f"{r}/test"), (ffcv, f"{r}/train.beton", f"{r}/test.beton"),
                                 (folder, f"{r}/imagefolder/train", f"{r}/imagefolder/test")):
        assert fmt.split_path(split, "train") == split
        assert fmt.test_path(DataConfig(format=fmt.name, path=r)) == held_out
        assert fmt.test_path(DataConfig(format=fmt.name, path=split)) == held_out
        assert fmt.test_path(DataConfig(format=fmt.name, path=split, test_path="elsewhere")) == "elsewhere"
    (root / "test").rmdir()
    with pytest.raises(ConfigError, match="no held-out split found next to data.path=.*data.eval_split=holdout"):
        wds.test_path(DataConfig(format="webdataset", path=r))


class _Arrays(formats.Format):
    """A format whose data is two in-memory arrays: what a new format module has to provide."""

    name = "test_arrays"
    needs_path = False

    def train_loader(self, cfg: DataConfig, preset: Any, *, rank: int, world_size: int, seed: int,
                     device: torch.device) -> Any:
        from hypersolid_scale.data.loading.builtin_sets import ArraySplit
        from hypersolid_scale.data.loading.random_access import InMemoryMultiCropLoader

        images = np.random.default_rng(0).integers(0, 256, (64, 20, 20), dtype=np.uint8)
        return InMemoryMultiCropLoader(ArraySplit(images, np.arange(64) % 4, ()), preset, rank=rank,
                                       world_size=world_size, seed=seed, batch_size=cfg.batch_size_per_gpu)

    def eval_dataset(self, cfg: DataConfig, preset: Any, split: str) -> Any:
        return torch.utils.data.TensorDataset(torch.zeros(8 if split == "train" else 4, 1, 16, 16))

    def num_classes(self, cfg: DataConfig) -> int | None:
        return 4


@pytest.fixture
def arrays_format():
    fmt = formats.register(_Arrays())
    yield fmt
    formats.unregister(fmt.name)
    assert fmt.name not in formats.names()


def test_a_registered_format_is_used_by_every_entry_point(arrays_format) -> None:
    with pytest.raises(ValueError, match="registered twice"):
        formats.register(_Arrays())
    cfg = DataConfig(format="test_arrays", preset="digits", batch_size_per_gpu=8, num_local_views=1, seed_offset=3)
    cfg.validate()
    loader = build_train_loader(cfg, rank=1, world_size=2, seed=4, device=CPU)
    assert loader.seed == 7 and loader.rank == 1 and len(loader) == 64 // 16  # seed + data.seed_offset
    views, labels = next(iter(loader))
    assert [tuple(v.shape) for v in views] == [(8, 1, 16, 16)] * 2 + [(8, 1, 8, 8)]
    train, test = build_eval_datasets(cfg)
    assert (len(train), len(test)) == (8, 4)
    train, held = build_eval_datasets(DataConfig(format="test_arrays", eval_split="holdout", holdout_fraction=0.25))
    assert (len(train), len(held)) == (6, 2)
    assert num_classes(cfg) == 4 and num_classes(DataConfig(format="test_arrays", num_classes=9)) == 9
    assert in_channels(cfg) == 1


class _Listing(formats.ConversionTarget):
    """A conversion target that lists what it was handed: one text file per split, a key in the manifest."""

    encodes = True

    def begin_split(self, split: str, classes: list, resumed: list) -> None:
        self.lines = [f"resumed {len(resumed)}"]

    def add(self, split: str, k: int, item: Any, data: Any, pending: list) -> None:
        self.lines.append(f"{k} {item.label} {len(data)}")

    def end_split(self, split: str, good: list, consumed: int, pending: list) -> dict:
        (self.conv.out / f"{split}.list").write_text("\n".join(self.lines) + "\n")
        return {"listing": {"good": len(good), "consumed": consumed}}


@pytest.fixture
def listing_format():
    fmt = type("_ListingFormat", (_Arrays,), {"name": "test_listing", "target": _Listing})()
    formats.register(fmt)
    yield fmt
    formats.unregister(fmt.name)


def test_a_registered_format_s_conversion_target_is_written_by_the_converter(listing_format, tmp_path) -> None:
    """A format module declares what the converter writes for it (its ConversionTarget); --formats takes it with
    nothing else edited, next to a built-in target, from one stream of the images."""
    from hypersolid_scale.data.convert import main as convert

    assert "test_listing" in formats.conversion_formats() and "builtin" not in formats.conversion_formats()
    out = tmp_path / "out"
    assert convert(["--builtin", "fashion_mnist", "--out", str(out), "--formats", "test_listing,webdataset",
                    "--limit", "12", "--shard-size", "5"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    for split in ("train", "test"):
        entry = manifest["splits"][split]
        assert entry["listing"] == {"good": 12, "consumed": 12} and len(entry["shards"]) == 3
        lines = (out / f"{split}.list").read_text().splitlines()
        assert lines[0] == "resumed 0" and [int(ln.split()[0]) for ln in lines[1:]] == list(range(12))
        assert all(int(ln.split()[2]) > 0 for ln in lines[1:])  # the encoded PNG's bytes
    with pytest.raises(SystemExit):  # a format without a target is no conversion output
        convert(["--builtin", "fashion_mnist", "--out", str(tmp_path / "b"), "--formats", "builtin"])


def test_num_classes_from_the_manifest_or_the_class_folders(tmp_path: Path) -> None:
    for c in ("a", "b", "c"):
        (tmp_path / "photos" / c).mkdir(parents=True)
    assert num_classes(DataConfig(format="imagefolder", path=str(tmp_path / "photos"))) == 3
    (tmp_path / "shards").mkdir()
    with pytest.raises(ConfigError, match="cannot tell the number of classes.*set data.num_classes"):
        num_classes(DataConfig(format="webdataset", path=str(tmp_path / "shards")))
    (tmp_path / "manifest.json").write_text(json.dumps({"num_classes": 7}))
    assert num_classes(DataConfig(format="webdataset", path=str(tmp_path / "shards"))) == 7
    manifest = WebDatasetOptions(manifest=str(tmp_path / "manifest.json"))
    assert num_classes(DataConfig(format="webdataset", path="x", webdataset=manifest)) == 7
    assert num_classes(DataConfig()) == 10


def test_validating_configs_and_converting_do_not_import_torch_or_the_readers() -> None:
    code = ("import sys\n"
            "import hypersolid_scale.data.convert\n"
            "from hypersolid_scale.data import DataConfig, in_channels\n"
            "for f in ('builtin', 'webdataset', 'ffcv', 'imagefolder'):\n"
            "    DataConfig(format=f, path='x').validate()\n"
            "assert in_channels(DataConfig(format='webdataset', path='x')) == 3\n"
            "print(sorted(m for m in ('torch', 'webdataset', 'ffcv', 'lightly') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_every_format_s_training_loader_is_a_train_loader(tmp_path: Path) -> None:
    """What the trainer, the builder and the resume ask of a loader (data/loading/protocol.py), for the loader of
    every format (and the device stage's), built from one small conversion: a format that gives another kind of
    object fails here, not in the middle of a run. FFCV's (its conversion and first batch cost ~60 s here) is
    checked where test_data_ffcv.py builds one."""
    from hypersolid_scale.data.convert import main as convert
    from hypersolid_scale.data.loading.protocol import TrainLoader

    out = tmp_path / "out"
    files = [f for f in formats.conversion_formats() if f != "ffcv"]
    assert convert(["--builtin", "digits", "--out", str(out), "--formats", ",".join(files), "--limit", "16",
                    "--shard-size", "8"]) == 0
    base = dict(preset="digits", batch_size_per_gpu=4, num_local_views=1, num_workers=0)
    cases = [("builtin", DataConfig(dataset="digits", **base)),
             ("builtin pil", DataConfig(dataset="digits", augment="pil", **base))]
    cases += [(f, DataConfig(format=f, path=str(out), **base)) for f in files]
    cases += [(f"{f} views_on=device", DataConfig(format=f, path=str(out), views_on="device", **base))
              for f in formats.device_view_formats()]
    assert {c[0].split()[0] for c in cases} | {"ffcv"} == set(formats.names()), "a format without a case here"
    for name, cfg in cases:
        cfg.validate()
        loader = build_train_loader(cfg, rank=0, world_size=1, seed=0, device=CPU)
        try:
            assert isinstance(loader, TrainLoader), name
            assert (loader.device_stage is not None) == ("device" in name), name
            assert isinstance(loader.world_size_invariant, bool) and len(loader) >= 1, name
            loader.set_epoch(0)
            views, labels = next(iter(loader))
            assert views[0].shape[0] == len(labels) == 4, name
            assert loader.state_dict()["batches_done"] == 1, name
        finally:
            loader.close()

