"""STL-10 from its binary files: the labelled splits, the unlabelled split (no labels) for pretraining, and
evaluation on the labelled splits while training on the unlabelled one."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from hypersolid_scale.data import DataConfig, build_eval_datasets, build_train_loader, num_classes
from hypersolid_scale.data.convert import main as convert
from hypersolid_scale.data.formats.webdataset.index import ShardIndexDataset
from hypersolid_scale.safety.errors import ConfigError, DataError

CLASSES = ["airplane", "bird", "car", "cat", "deer", "dog", "horse", "monkey", "ship", "truck"]
SIZES = {"train": 20, "test": 10, "unlabeled": 36}


def images_of(split: str, n: int) -> np.ndarray:
    """(n, 96, 96, 3) uint8, distinct per split and image."""
    rng = np.random.default_rng(len(split))
    return rng.integers(0, 256, (n, 96, 96, 3), dtype=np.uint8)


def write_stl10(root: Path, splits: dict[str, int] = SIZES) -> Path:
    """STL-10's binary release layout (what torchvision downloads): root/stl10_binary/<split>_X.bin (each image
    channel by channel, column by column), <split>_y.bin (labels 1..10), class_names.txt."""
    d = root / "stl10_binary"
    d.mkdir(parents=True)
    (d / "class_names.txt").write_text("\n".join(CLASSES) + "\n")
    for split, n in splits.items():
        (d / f"{split}_X.bin").write_bytes(images_of(split, n).transpose(0, 3, 2, 1).tobytes())
        if split != "unlabeled":
            (d / f"{split}_y.bin").write_bytes((np.arange(n) % 10 + 1).astype(np.uint8).tobytes())
    return root


def test_stl10_binary_files_are_read_as_torchvision_reads_them(tmp_path) -> None:
    from torchvision.datasets import STL10

    from hypersolid_scale.data.convert.sources import stl10_source

    root = write_stl10(tmp_path / "stl10")
    source = stl10_source(str(root), ["train", "unlabeled"])
    assert source.classes == CLASSES and source.unlabeled == {"unlabeled"}
    # torchvision's own reader of the same files (its constructor would insist on the real files' md5).
    tv = STL10.__new__(STL10)
    tv.root = str(root)
    x, y = tv._STL10__loadfile("train_X.bin", "train_y.bin")
    items = source.splits["train"]
    assert len(items) == len(x) == 20
    for i in (0, 7, 19):
        img = np.asarray(items[i].load())
        np.testing.assert_array_equal(img, np.transpose(x[i], (1, 2, 0)))
        np.testing.assert_array_equal(img, images_of("train", 20)[i])
        assert items[i].label == int(y[i])
    assert [it.label for it in source.splits["unlabeled"]][:3] == [-1, -1, -1]


def test_unlabeled_split_converts_trains_and_evaluates_on_the_labelled_splits(tmp_path) -> None:
    root = write_stl10(tmp_path / "stl10")
    out = tmp_path / "data" / "stl10"
    assert convert(["--torchvision", "STL10", "--root", str(root), "--out", str(out), "--formats", "webdataset",
                    "--split", "train,test,unlabeled", "--shard-size", "16"]) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["classes"] == CLASSES and m["num_classes"] == 10
    unlabeled = m["splits"]["unlabeled"]
    assert unlabeled["labeled"] is False and "per_class" not in unlabeled and unlabeled["count"] == 36
    assert m["splits"]["train"]["labeled"] is True and sum(m["splits"]["train"]["per_class"].values()) == 20
    assert [s["count"] for s in unlabeled["shards"]] == [16, 16, 4]
    assert {label for *_, label in ShardIndexDataset(str(out / "unlabeled")).items} == {-1}

    cfg = DataConfig(format="webdataset", dataset="stl10", path=str(out / "unlabeled"), batch_size_per_gpu=8,
                     num_workers=0, num_local_views=1, global_crop_size=32, local_crop_size=16)
    loader = build_train_loader(cfg, rank=0, world_size=1, seed=0, device=torch.device("cpu"))
    batches = list(loader)
    assert len(batches) == len(loader) == 36 // 8
    views, labels = batches[0]
    assert [tuple(v.shape) for v in views] == [(8, 3, 32, 32)] * 2 + [(8, 3, 16, 16)] and set(labels.tolist()) == {-1}
    # Evaluation: the labelled train and test splits next to the unlabelled one.
    train, test = build_eval_datasets(cfg)
    assert (len(train), len(test)) == (20, 10)
    assert sorted(y for _, y in train) == sorted(np.arange(20) % 10) and tuple(test[0][0].shape) == (3, 32, 32)
    assert num_classes(cfg) == 10
    # Named explicitly (the shipped config does): the same.
    named = DataConfig(**{**cfg.__dict__, "eval_train_path": str(out / "train"), "test_path": str(out / "test")})
    assert [len(d) for d in build_eval_datasets(named)] == [20, 10]


def test_unlabeled_split_alone_needs_labelled_data_for_evaluation(tmp_path) -> None:
    root = write_stl10(tmp_path / "stl10", {"unlabeled": 12})
    out = tmp_path / "stl10_unlabeled"
    assert convert(["--torchvision", "STL10", "--root", str(root), "--out", str(out), "--formats", "webdataset",
                    "--split", "unlabeled"]) == 0
    cfg = DataConfig(format="webdataset", dataset="stl10", path=str(out / "unlabeled"), eval_split="holdout")
    with pytest.raises(ConfigError, match="holds no labels.*set data.eval_train_path"):
        build_eval_datasets(cfg)
    with pytest.raises(ConfigError, match="--formats imagefolder cannot hold the split.*unlabeled"):
        convert(["--torchvision", "STL10", "--root", str(root), "--out", str(tmp_path / "f"), "--formats", "imagefolder",
                 "--split", "unlabeled"])


def test_damaged_or_missing_stl10_files_are_named(tmp_path) -> None:
    root = write_stl10(tmp_path / "stl10", {"train": 4})
    x = root / "stl10_binary" / "train_X.bin"
    x.write_bytes(x.read_bytes()[:-100])
    with pytest.raises(DataError, match="train_X.bin holds .* not a whole number of 27648-byte STL-10 images"):
        convert(["--torchvision", "STL10", "--root", str(root), "--out", str(tmp_path / "o"), "--split", "train"])
    with pytest.raises(DataError, match="test_X.bin does not exist"):
        convert(["--torchvision", "STL10", "--root", str(root), "--out", str(tmp_path / "o"), "--split", "test"])
    with pytest.raises(ConfigError, match="--split 'validation': STL-10 has the splits"):
        convert(["--torchvision", "STL10", "--root", str(root), "--out", str(tmp_path / "o"), "--split", "validation"])
    with pytest.raises(DataError, match="no STL-10 binary files"):
        convert(["--torchvision", "STL10", "--root", str(tmp_path), "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()
