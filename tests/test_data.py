"""Presets, builtin datasets, the PIL (lightly) and tensor multi-crop paths, in-memory loader, eval data."""

from __future__ import annotations

import gzip
from dataclasses import replace

import numpy as np
import pytest
import torch
from _data_helpers import (
    assert_pil_statistics_match,
    assert_same_mean,
    fashion_mnist_or_skip,
    limit_batches,
    pil_records,
    probe_images,
)
from PIL import Image
from torchvision import transforms as T

from hypersolid_scale.data import (
    PRESETS,
    DataConfig,
    build_eval_datasets,
    build_train_loader,
    in_channels,
    num_classes,
    resolve_preset,
)
from hypersolid_scale.data.augment.tensor_aug import (
    COL_CROP,
    COL_FLIP,
    TensorMultiCrop,
    keyed_uniforms,
    sample_crop_boxes,
)
from hypersolid_scale.data.augment.transforms import build_eval_transform, build_pil_multicrop
from hypersolid_scale.data.loading.builtin_sets import fashion_mnist_dir, load_digits, read_idx

CPU = torch.device("cpu")


# ---------------------------------------------------------------- presets (paper table) -----------
def test_default_preset_is_the_paper_table() -> None:
    p = PRESETS["default"]
    assert (p.global_crop_size, p.global_crop_scale, p.local_crop_size, p.local_crop_scale) == \
        (224, (0.4, 1.0), 96, (0.05, 0.4))
    assert (p.num_local_views, p.hflip_prob, p.cj_prob, p.cj_strength) == (6, 0.5, 0.8, 0.5)
    assert p.cj_factors == (0.8, 0.8, 0.4, 0.2) and p.gray_prob == 0.2
    assert p.blur_probs == (1.0, 0.1, 0.5) and p.blur_sigmas == (0.1, 2.0) and p.solarize_prob == 0.2
    assert p.mean == (0.485, 0.456, 0.406) and p.std == (0.229, 0.224, 0.225)
    assert p.view_solarize_probs()[:3] == [0.0, 0.2, 0.0]


def test_per_dataset_changes_of_the_paper_table() -> None:
    c = PRESETS["cifar10"]
    assert (c.global_crop_size, c.global_crop_scale, c.local_crop_size, c.local_crop_scale) == \
        (32, (0.8, 1.0), 32, (0.08, 0.9))
    assert c.blur_probs == (0.0, 0.0, 0.0)
    assert (PRESETS["stl10"].global_crop_size, PRESETS["stl10"].local_crop_size) == (96, 48)
    assert (PRESETS["vit"].global_crop_size, PRESETS["vit"].local_crop_size) == (224, 224)
    f = PRESETS["fashion_mnist"]
    assert f.channels == 1 and f.global_crop_size == 28 and f.blur_probs == (0.0, 0.0, 0.0)


def test_config_selects_and_overrides_the_preset() -> None:
    assert resolve_preset(DataConfig()).name == "fashion_mnist"
    assert resolve_preset(DataConfig(format="webdataset", path="x")).name == "default"
    p = resolve_preset(DataConfig(preset="imagenet", num_local_views=2, global_crop_size=64,
                                  local_crop_scale=[0.1, 0.3]))
    assert (p.num_views, p.global_crop_size, p.local_crop_scale, p.eval_resize) == (4, 64, (0.1, 0.3), 73)
    assert in_channels(DataConfig()) == 1 and in_channels(DataConfig(preset="cifar")) == 3
    with pytest.raises(ValueError, match="data.preset='nope'"):
        resolve_preset(DataConfig(preset="nope"))
    for bad, match in ((dict(dataset="mnist"), "data.dataset"), (dict(augment="gpu"), "data.augment"),
                       (dict(global_crop_scale=[0.5, 0.2]), "global_crop_scale"),
                       (dict(format="ffcv"), "needs data.path")):
        with pytest.raises(ValueError, match=match):
            DataConfig(**bad).validate()


# ---------------------------------------------------------------- builtin datasets ----------------
def test_fashion_mnist_idx_files() -> None:
    train, test = fashion_mnist_or_skip("train"), fashion_mnist_or_skip("test")
    assert train.images.shape == (60000, 28, 28) and test.images.shape == (10000, 28, 28)
    assert train.images.dtype == np.uint8 and np.bincount(train.labels).tolist() == [6000] * 10
    assert np.bincount(test.labels).tolist() == [1000] * 10
    assert num_classes(DataConfig()) == 10
    # The preset's normalisation constants are the dataset's statistics.
    x = train.images / 255.0
    assert abs(x.mean() - PRESETS["fashion_mnist"].mean[0]) < 1e-3
    assert abs(x.std() - PRESETS["fashion_mnist"].std[0]) < 1e-3


def test_missing_or_truncated_idx_files_say_what_to_do(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist"):
        fashion_mnist_dir(str(tmp_path))
    fashion_mnist_or_skip("test")
    src = fashion_mnist_dir() / "t10k-labels-idx1-ubyte.gz"
    data = gzip.decompress(src.read_bytes())
    (tmp_path / "short").write_bytes(data[:-10])
    with pytest.raises(ValueError, match="truncated"):
        read_idx(tmp_path / "short")


def test_digits_splits_are_disjoint_and_stratified() -> None:
    tr, te = load_digits("train"), load_digits("test")
    assert len(tr) + len(te) == 1797 and tr.images.shape[1:] == (8, 8) and tr.images.max() == 255
    assert min(np.bincount(te.labels)) >= 30
    rows = {r.tobytes() for r in tr.images}
    assert sum(r.tobytes() in rows for r in te.images) < 10  # digits holds a few exact duplicates


# ---------------------------------------------------------------- multi-crop paths ----------------
def _small_default(**kw):
    return replace(PRESETS["default"], global_crop_size=32, local_crop_size=16, num_local_views=2, **kw)


def test_pil_and_tensor_paths_agree_on_sizes_dtype_and_normalisation() -> None:
    preset = _small_default(cj_prob=0.0, gray_prob=0.0, blur_probs=(0.0, 0.0, 0.0), solarize_prob=0.0)
    img = np.full((40, 48, 3), (200, 100, 30), np.uint8)
    expect = (np.array([200, 100, 30]) / 255.0 - np.array(preset.mean)) / np.array(preset.std)
    pil_views = build_pil_multicrop(preset)(Image.fromarray(img))
    tensor_views = TensorMultiCrop(preset)(torch.from_numpy(img).permute(2, 0, 1)[None], torch.tensor([0]), 0)
    for views in (pil_views, [v[0] for v in tensor_views]):
        assert [tuple(v.shape) for v in views] == [(3, 32, 32)] * 2 + [(3, 16, 16)] * 2
        for v in views:
            assert v.dtype == torch.float32
            np.testing.assert_allclose(v.mean(dim=(1, 2)).numpy(), expect, atol=2e-2)


def test_crop_sampler_matches_torchvision() -> None:
    for scale, (h, w) in (((0.05, 0.4), (64, 64)), ((0.4, 1.0), (30, 50))):
        u = keyed_uniforms(0, 0, torch.arange(4000), view=0)[:, COL_CROP:COL_FLIP]
        ours = sample_crop_boxes(u, h, w, scale)
        ours_area = (ours[:, 2] * ours[:, 3] / (h * w)).numpy()
        ref = np.array([np.prod(T.RandomResizedCrop.get_params(torch.empty(1, h, w), scale, (3 / 4, 4 / 3))[2:])
                        for _ in range(4000)]) / (h * w)
        assert_same_mean(f"crop area {scale}", ours_area, ref)
        assert (ours[:, 0] >= 0).all() and (ours[:, 0] + ours[:, 2] <= w).all()
        assert (ours[:, 1] >= 0).all() and (ours[:, 1] + ours[:, 3] <= h).all()


def test_tensor_path_has_the_statistics_of_the_pil_path() -> None:
    preset = _small_default()
    images = probe_images(160, 64)
    records = pil_records(preset, images)
    rec: dict = {}
    TensorMultiCrop(preset, seed=3)(torch.from_numpy(images).permute(0, 3, 1, 2), torch.arange(len(images)), 0,
                                    record=rec)
    views = ["global_0", "global_1", "local", "local"]
    other: dict = {"global_0": {}, "global_1": {}, "local": {}}
    for key, src in (("area", "area"), ("flipped", "flip"), ("jitter", "jitter"), ("gray", "gray"),
                     ("blur", "blur"), ("solarize", "solarize")):
        for name in other:
            other[name][key] = np.concatenate([rec[src][i].numpy() for i, v in enumerate(views) if v == name])
    assert_pil_statistics_match(records, other, preset)


# ---------------------------------------------------------------- in-memory loader ---------------
def test_in_memory_loader_splits_ranks_and_resumes_exactly() -> None:
    cfg = DataConfig(dataset="digits", batch_size_per_gpu=32)
    loaders = [build_train_loader(cfg, rank=r, world_size=3, seed=5, device=CPU) for r in range(3)]
    assert len({len(ld) for ld in loaders}) == 1 and len(loaders[0]) == 1437 // (3 * 32)
    views, labels = next(iter(loaders[0]))
    assert [tuple(v.shape) for v in views] == [(32, 1, 16, 16)] * 2 + [(32, 1, 8, 8)] * 6
    assert labels.dtype == torch.int64
    # Uninterrupted run of rank 1 vs a run restored after 4 batches: same views, same labels.
    ref = list(loaders[1])
    assert len(ref) == len(loaders[1])
    partial = build_train_loader(cfg, rank=1, world_size=3, seed=5, device=CPU)
    it = iter(partial)
    for _ in range(4):
        next(it)
    state = partial.state_dict()
    assert state["batches_done"] == 4 and state["epoch"] == 0
    resumed = build_train_loader(cfg, rank=1, world_size=3, seed=5, device=CPU)
    resumed.load_state_dict(state)
    resumed.set_epoch(0)
    rest = list(resumed)
    assert len(rest) == len(ref) - 4
    for (v1, l1), (v2, l2) in zip(ref[4:], rest):
        assert torch.equal(l1, l2) and all(torch.equal(a, b) for a, b in zip(v1, v2))
    # A new epoch is a new order.
    loaders[1].set_epoch(1)
    assert not torch.equal(next(iter(loaders[1]))[1], ref[0][1])


def test_pil_path_of_a_builtin_dataset() -> None:
    cfg = DataConfig(dataset="digits", augment="pil", batch_size_per_gpu=16, num_workers=0, num_local_views=2)
    loader = limit_batches(build_train_loader(cfg, rank=0, world_size=1, seed=0, device=CPU), 3)
    batches = list(loader)
    assert len(batches) == len(loader) == 3
    assert [tuple(v.shape) for v in batches[0][0]] == [(16, 1, 16, 16)] * 2 + [(16, 1, 8, 8)] * 2


# ---------------------------------------------------------------- evaluation ---------------------
def test_eval_transform_is_deterministic_resize_center_crop() -> None:
    tf = build_eval_transform(PRESETS["default"])
    img = Image.fromarray(np.random.default_rng(0).integers(0, 255, (300, 400, 3), dtype=np.uint8))
    a, b = tf(img), tf(img)
    assert tuple(a.shape) == (3, 224, 224) and torch.equal(a, b)
    assert tuple(build_eval_transform(PRESETS["cifar"])(img).shape) == (3, 32, 32)


def test_eval_datasets_of_fashion_mnist_and_holdout() -> None:
    fashion_mnist_or_skip()
    train, test = build_eval_datasets(DataConfig())
    assert (len(train), len(test)) == (60000, 10000)
    x, y = test[0]
    assert tuple(x.shape) == (1, 28, 28) and isinstance(y, int)
    raw = fashion_mnist_or_skip("test").images[0] / 255.0
    np.testing.assert_allclose(x[0].numpy(), (raw - 0.2860) / 0.3530, atol=1e-5)
    tr, ho = build_eval_datasets(DataConfig(dataset="digits", eval_split="holdout", holdout_fraction=0.25))
    assert len(ho) == round(1437 * 0.25) and len(tr) + len(ho) == 1437
    assert tuple(tr[0][0].shape) == (1, 16, 16)


def test_tensor_multicrop_inside_autocast_gives_the_same_float32_views() -> None:
    """A caller's bf16 autocast (the training forward) must not reach the augmentations: blur under autocast
    returns bf16 and writing it back into the float32 batch failed; the views must not depend on the caller."""
    from hypersolid_scale.data.augment.tensor_aug import TensorMultiCrop

    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (8, 3, 48, 48), dtype=torch.uint8, generator=g)
    indices = torch.arange(8)
    multicrop = TensorMultiCrop(PRESETS["imagenet"], "cpu", seed=1)
    plain = multicrop(images, indices, 0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = multicrop(images, indices, 0)
    for a, b in zip(plain, inside):
        assert b.dtype == torch.float32 and torch.equal(a, b)
