"""WebDataset loader on real shards: rank split, equal batches, corrupt samples, bad shards, resume
(streaming over http, pipe: and fsspec, truncated shards and the loss limit: test_data_webdataset_streams.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from _data_helpers import convert_shards, fashion_mnist_or_skip, jpg_bytes, limit_batches, png_bytes, write_shard

from hypersolid_scale.data import DataConfig, build_eval_datasets, build_train_loader
from hypersolid_scale.data.augment.presets import PRESETS
from hypersolid_scale.data.formats.webdataset.stream import ShardIndexDataset, WebDatasetLoader
from hypersolid_scale.safety.errors import DataError

CPU = torch.device("cpu")
PRESET = PRESETS["fashion_mnist"].__class__(**{**PRESETS["fashion_mnist"].__dict__, "num_local_views": 1})


def make_shards(d: Path, sizes: list[int], corrupt: dict[int, int] | None = None) -> list[Path]:
    """Shards of real Fashion-MNIST images; the label of sample i is i (so tests can track samples).

    corrupt: {shard index: how many of its samples are broken JPEGs (truncated or not an image)}.
    """
    images = fashion_mnist_or_skip().images
    d.mkdir(parents=True, exist_ok=True)
    paths, i = [], 0
    for s, size in enumerate(sizes):
        samples = []
        for j in range(size):
            if corrupt and j < corrupt.get(s, 0):
                good = jpg_bytes(images[i])
                data = good[: len(good) // 2] if j % 2 == 0 else b"definitely not a jpeg"
                samples.append((f"s{s}_{j:04d}", "jpg", data, -1))
            else:
                samples.append((f"s{s}_{j:04d}", "png", png_bytes(images[i]), i))
                i += 1
        paths.append(d / f"shard-{s:06d}.tar")
        write_shard(paths[-1], samples)
    return paths


def loader(urls: str, **kw) -> WebDatasetLoader:
    args = dict(rank=0, world_size=1, seed=0, batch_size=16, num_workers=0, shuffle_buffer=32)
    args.update(kw)
    return WebDatasetLoader(urls, PRESET, **args)


def labels_of(ld) -> list[torch.Tensor]:
    return [labels for _, labels in ld]


@pytest.mark.parametrize("workers", [0, 2])
def test_every_rank_gets_the_same_batches_and_its_own_shards(tmp_path, workers: int) -> None:
    make_shards(tmp_path, [48, 48, 48, 48])
    ranks = [loader(str(tmp_path), rank=r, world_size=2, num_workers=workers) for r in (0, 1)]
    assert [len(ld) for ld in ranks] == [192 // 32] * 2
    seen = []
    for ld in ranks:
        batches = list(ld)
        assert len(batches) == len(ld)
        views, labels = batches[0]
        assert [tuple(v.shape) for v in views] == [(16, 1, 28, 28)] * 2 + [(16, 1, 16, 16)]
        assert all(v.dtype == torch.float32 for v in views)
        lab = torch.cat([b[1] for b in batches]).tolist()
        assert len(set(lab)) == len(lab) == 96  # no repeats inside a rank
        seen.append(set(lab))
    assert not seen[0] & seen[1]  # ranks read disjoint shards


def test_uneven_shards_still_give_equal_batch_counts(tmp_path) -> None:
    make_shards(tmp_path, [70, 10, 33, 51, 7])
    urls = str(tmp_path / "shard-{000000..000004}.tar")
    lens = set()
    for rank in range(3):
        ld = loader(urls, rank=rank, world_size=3, num_workers=2)
        lens.add((len(ld), len(list(ld))))
    assert lens == {(171 // 48, 171 // 48)}


def test_corrupt_jpegs_in_a_shard_are_skipped_and_counted(tmp_path) -> None:
    make_shards(tmp_path, [40, 60], corrupt={1: 4})
    ld = loader(str(tmp_path))  # the default loss limit is about shards, not undecodable samples
    assert len(ld) == 100 // 16
    with pytest.warns(UserWarning, match="skipping sample"):
        labels = torch.cat(labels_of(ld))
    assert (labels >= 0).all() and len(set(labels.tolist())) == 96
    assert ld.stats["corrupt_skipped"] == 4
    # Counted again, not reset, in the next epoch (and carried by the state dict).
    ld.set_epoch(1)
    with pytest.warns(UserWarning):
        list(ld)
    assert ld.state_dict()["stats"]["corrupt_skipped"] == 8


def test_missing_or_unreadable_shard_is_named(tmp_path) -> None:
    make_shards(tmp_path, [20, 20])
    with pytest.raises(FileNotFoundError, match="shard-000002.tar"):
        loader(str(tmp_path / "shard-{000000..000002}.tar"))
    (tmp_path / "shard-000002.tar").write_bytes(b"\x00garbage" * 700)
    with pytest.raises(DataError, match="cannot read shard .*shard-000002.tar.*not a tar archive.*data.convert"):
        list(loader(str(tmp_path / "shard-000000.tar") + "," + str(tmp_path / "shard-000002.tar")))


def test_shards_without_a_usable_sample_are_a_data_error(tmp_path, converted) -> None:
    for shard in (converted / "train").glob("*.tar"):  # the manifest still promises 20 samples each
        write_shard(shard, [])
    with pytest.raises(DataError, match=r"shards \[.*shard-00000.\.tar.*\] hold no samples .*data.convert"):
        list(loader(str(converted / "train"), max_lost_fraction=1.0))
    make_shards(tmp_path / "bad", [10], corrupt={0: 10})
    with pytest.raises(DataError, match="no sample of shards .*shard-000000.tar.* decodes"):
        list(loader(str(tmp_path / "bad"), batch_size=4))


@pytest.mark.parametrize("workers", [0, 2])
def test_position_is_saved_and_restored(tmp_path, workers: int) -> None:
    make_shards(tmp_path, [50, 50, 50, 50])
    full = labels_of(loader(str(tmp_path), num_workers=workers))
    first = loader(str(tmp_path), num_workers=workers)
    it = iter(first)
    for _ in range(3):
        next(it)
    state = first.state_dict()
    assert state["batches_done"] == 3
    resumed = loader(str(tmp_path), num_workers=workers)
    resumed.load_state_dict(state)
    rest = labels_of(resumed)
    assert len(rest) == len(full) - 3
    assert all(torch.equal(a, b) for a, b in zip(full[3:], rest))
    resumed.set_epoch(1)  # next epoch starts from the beginning, in a new order
    nxt = labels_of(resumed)
    assert len(nxt) == len(full) and not torch.equal(torch.cat(nxt), torch.cat(full))


def test_shard_index_dataset_and_config_entry_point(tmp_path) -> None:
    make_shards(tmp_path / "train", [30, 30])
    make_shards(tmp_path / "test", [20])
    ds = ShardIndexDataset(str(tmp_path / "train"), mode="L")
    assert len(ds) == 60
    img, label = ds[37]
    ref = fashion_mnist_or_skip().images[label]
    np.testing.assert_array_equal(np.asarray(img), ref)
    cfg = DataConfig(format="webdataset", path=str(tmp_path), preset="fashion_mnist", num_classes=60,
                     batch_size_per_gpu=8, num_workers=0, num_local_views=2)
    train, test = build_eval_datasets(cfg)
    assert (len(train), len(test)) == (60, 20)
    x, y = test[3]
    assert tuple(x.shape) == (1, 28, 28) and torch.equal(x, test[3][0]) and isinstance(y, int)
    ld = limit_batches(build_train_loader(cfg, rank=0, world_size=1, seed=0, device=CPU), 2)
    assert len(ld) == 2 and len(list(ld)) == 2


@pytest.fixture
def converted(tmp_path) -> Path:
    """4 train shards of 20 samples (labels 0..79) and 1 test shard, with the converter's manifest."""
    convert_shards(tmp_path / "data", {"train": 80, "test": 20}, shard_size=20)
    return tmp_path / "data"
