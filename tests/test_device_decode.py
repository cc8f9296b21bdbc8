"""data.views_on=device (docs/design.md §3e): the workers draw exactly the PIL path's view parameters, the device
cuts every view from one decode and agrees with the PIL path's pixels, and the loaders built on it keep the
data contract (world-size invariance, corrupt samples skipped and counted)."""

from __future__ import annotations

import io
import random
import tarfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image, ImageFilter, ImageOps
from torchvision.transforms import v2

from hypersolid_scale.data import PRESETS, DataConfig, build_train_loader
from hypersolid_scale.data.augment import view_params as vp
from hypersolid_scale.data.augment.transforms import build_pil_multicrop, seeded_global_rngs
from hypersolid_scale.data.device.views import DeviceStage, HostStage, collate_host
from hypersolid_scale.data.formats.webdataset import WebDatasetOptions
from hypersolid_scale.safety.errors import ConfigError

SEED, EPOCH = 5, 3
# Every decision exercised on small views: blur on every view, solarize often, all four jitters (RGB).
SMALL = replace(PRESETS["default"], global_crop_size=32, local_crop_size=16, num_local_views=2,
                blur_probs=(1.0, 0.5, 0.5), solarize_prob=0.5)


def photos(n: int, seed: int = 0) -> list[bytes]:
    """Distinct JPEGs cut from scikit-learn's two sample photographs, 40-120 px a side, quality 85-95."""
    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(seed)
    sources = load_sample_images().images
    out = []
    for i in range(n):
        src = sources[i % len(sources)]
        h, w = int(rng.integers(40, 121)), int(rng.integers(40, 121))
        y, x = int(rng.integers(0, src.shape[0] - h)), int(rng.integers(0, src.shape[1] - w))
        buf = io.BytesIO()
        Image.fromarray(src[y:y + h, x:x + w]).save(buf, "JPEG", quality=int(rng.integers(85, 96)))
        out.append(buf.getvalue())
    return out


# ------------------------------------------------------------- what the PIL path really drew --------
def recorded_pil_params(preset: Any, data: bytes, index: int, monkeypatch: pytest.MonkeyPatch) -> np.ndarray:
    """Run the real PIL multi-crop on one image and record every decision it made, from its own calls."""
    import lightly.transforms.gaussian_blur as lightly_blur
    import lightly.transforms.solarize as lightly_solarize

    transform = build_pil_multicrop(preset)
    rows: list[np.ndarray] = []

    def new_row() -> np.ndarray:
        row = np.zeros(vp.NUM_PARAMS)
        row[vp.FACTORS:vp.FACTORS + 3] = 1.0
        rows.append(row)
        return row

    def wrap_params(stage: Any, kind: str) -> None:
        inner = stage.make_params

        def make_params(flat: list) -> dict:
            p = inner(flat)
            if kind == "crop":
                new_row()[[vp.TOP, vp.LEFT, vp.HEIGHT, vp.WIDTH]] = (p["top"], p["left"], p["height"], p["width"])
            else:
                rows[-1][vp.JITTER] = 1
                rows[-1][vp.ORDER:vp.ORDER + 4] = p["fn_idx"].numpy()
                rows[-1][vp.FACTORS:vp.FACTORS + 4] = [p[k] for k in ("brightness_factor", "contrast_factor",
                                                                    "saturation_factor", "hue_factor")]
            return p
        stage.make_params = make_params

    def wrap_transform(stage: Any, col: int) -> None:
        inner = stage.transform

        def transform_(inpt: Any, params: dict) -> Any:  # torchvision calls it only when the stage applies
            rows[-1][col] = 1
            return inner(inpt, params)
        stage.transform = transform_

    for view in {id(v): v for v in transform.transforms}.values():
        for stage in view.transform.transforms:
            if isinstance(stage, v2.RandomResizedCrop):
                wrap_params(stage, "crop")
            elif isinstance(stage, v2.RandomApply):
                wrap_params(stage.transforms[0], "jitter")
            elif isinstance(stage, v2.RandomHorizontalFlip):
                wrap_transform(stage, vp.FLIP)
            elif isinstance(stage, v2.RandomGrayscale):
                wrap_transform(stage, vp.GRAY)

    class Blur:
        @staticmethod
        def GaussianBlur(radius: float) -> Any:
            rows[-1][vp.BLUR], rows[-1][vp.SIGMA] = 1, radius
            return ImageFilter.GaussianBlur(radius)

    class Solarize:
        @staticmethod
        def solarize(img: Any, threshold: int) -> Any:
            rows[-1][vp.SOLARIZE] = 1
            return ImageOps.solarize(img, threshold)

    monkeypatch.setattr(lightly_blur, "ImageFilter", Blur)
    monkeypatch.setattr(lightly_solarize, "ImageOps", Solarize)
    img = Image.open(io.BytesIO(data)).convert("RGB" if preset.channels == 3 else "L")
    with seeded_global_rngs(SEED, EPOCH, index):
        transform(img)
    out = np.stack(rows)
    out[:, vp.IMAGE_HEIGHT], out[:, vp.IMAGE_WIDTH] = img.size[1], img.size[0]
    return out


@pytest.mark.parametrize("preset", [SMALL, PRESETS["default"], PRESETS["fashion_mnist"]], ids=lambda p: p.name)
def test_the_workers_draw_exactly_the_pil_paths_decisions(preset: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    views = vp.view_transforms(build_pil_multicrop(preset))
    seen = np.zeros(vp.NUM_PARAMS)
    for index, data in enumerate(photos(24, seed=1)):
        with monkeypatch.context() as m:
            expected = recorded_pil_params(preset, data, index, m)
        width, height = Image.open(io.BytesIO(data)).size
        with seeded_global_rngs(SEED, EPOCH, index):
            got = vp.draw_view_params(views, height, width)
            after = random.random(), float(np.random.random_sample()), float(torch.rand(1))
        with seeded_global_rngs(SEED, EPOCH, index):  # the generators end where the PIL path leaves them
            build_pil_multicrop(preset)(Image.open(io.BytesIO(data)).convert("RGB" if preset.channels == 3 else "L"))
            assert after == (random.random(), float(np.random.random_sample()), float(torch.rand(1)))
        np.testing.assert_array_equal(got, expected)
        seen += np.abs(got - np.array([0] * vp.FACTORS + [1, 1, 1, 0] + [0] * 6)).sum(0) > 0
    possible = {vp.FLIP: preset.hflip_prob, vp.JITTER: preset.cj_prob, vp.GRAY: preset.gray_prob,
                vp.BLUR: max(preset.blur_probs), vp.SOLARIZE: preset.solarize_prob}
    for col, p in possible.items():  # every decision the preset can take was taken somewhere
        assert (seen[col] > 0) == (p > 0), col


def test_the_crop_box_falls_back_like_torchvision_on_extreme_shapes() -> None:
    """A 1:6 strip rarely fits a 3:4..4:3 box: torchvision's fallback (a centred box) must come out too."""
    preset = replace(SMALL, global_crop_scale=(0.9, 1.0))
    views = vp.view_transforms(build_pil_multicrop(preset))
    ref = build_pil_multicrop(preset).transforms[0].transform.transforms[0]
    with seeded_global_rngs(SEED, EPOCH, 0):
        got = vp.draw_view_params(views, 20, 120)[0]
    with seeded_global_rngs(SEED, EPOCH, 0):
        p = ref.make_params([torch.zeros(()).expand(1, 20, 120)])
    assert (got[vp.TOP], got[vp.LEFT], got[vp.HEIGHT], got[vp.WIDTH]) == (p["top"], p["left"], p["height"], p["width"])
    assert got[vp.WIDTH] == round(20 * 4 / 3)  # the fallback: full height, widest allowed aspect


# ------------------------------------------------------------------- pixels -------------------------
def _device_and_pil(preset: Any, data: list[bytes], jpeg_decoder: str = "device") -> tuple[list, list]:
    host, stage, pil = HostStage(preset, jpeg_decoder), DeviceStage(preset, "cpu"), build_pil_multicrop(preset)
    items, ref = [], []
    for i, d in enumerate(data):
        with seeded_global_rngs(SEED, EPOCH, i):
            items.append((host(d), i))
        with seeded_global_rngs(SEED, EPOCH, i):
            ref.append(pil(Image.open(io.BytesIO(d)).convert("RGB")))
    batch, _ = collate_host(items)
    return stage(batch), [torch.stack([r[v] for r in ref]) for v in range(preset.num_views)]


def _levels(preset: Any, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b| in 8-bit levels (the views are normalised)."""
    return (a - b).abs() * torch.tensor(preset.std).view(1, -1, 1, 1) * 255


def test_pixels_agree_with_the_pil_path() -> None:
    """Geometry alone: torch's 8-bit bicubic resize on the CPU is PIL's algorithm (measured on 24 photos: 0.008 of
    a level on average, at most 2); every photometric step on: about 1 level on average (kornia's hue and blur
    are not PIL's; measured 1.06, 99th percentile 5.3), docs/design.md §3e."""
    data = photos(24, seed=2)
    geometry = replace(SMALL, cj_prob=0.0, gray_prob=0.0, blur_probs=(0.0, 0.0, 0.0), solarize_prob=0.0)
    dev, ref = _device_and_pil(geometry, data)
    diffs = torch.cat([_levels(geometry, a, b).flatten() for a, b in zip(dev, ref)])
    assert float(diffs.mean()) < 0.05 and float(diffs.max()) <= 3, (float(diffs.mean()), float(diffs.max()))
    dev, ref = _device_and_pil(SMALL, data)
    diffs = torch.cat([_levels(SMALL, a, b).flatten() for a, b in zip(dev, ref)])
    assert float(diffs.mean()) < 2.0, float(diffs.mean())
    # Against a wrong draw (another sample's views) the gap is an order of magnitude larger.
    assert float(_levels(SMALL, dev[0], ref[0].roll(1, 0)).mean()) > 10 * float(diffs.mean())


def test_decoding_in_the_workers_gives_the_same_views() -> None:
    data = photos(6, seed=3)
    on_device, _ = _device_and_pil(SMALL, data, "device")
    in_workers, _ = _device_and_pil(SMALL, data, "workers")
    for a, b in zip(on_device, in_workers):
        assert torch.equal(a, b)


def test_png_gray_and_cmyk_files_are_decoded_in_the_workers_as_the_pil_path_does() -> None:
    arr = np.asarray(Image.open(io.BytesIO(photos(1, seed=4)[0])))
    files = []
    for mode, fmt in (("RGB", "PNG"), ("L", "JPEG"), ("CMYK", "JPEG")):
        buf = io.BytesIO()
        Image.fromarray(arr).convert(mode).save(buf, fmt)
        files.append(buf.getvalue())
    host = HostStage(SMALL)
    samples = [host(f) for f in files]
    assert [s.encoded for s in samples] == [False, False, False]
    for s, f in zip(samples, files):
        expected = np.asarray(Image.open(io.BytesIO(f)).convert("RGB")).transpose(2, 0, 1)
        np.testing.assert_array_equal(s.payload.numpy(), expected)


def test_a_jpeg_that_fails_on_the_device_is_replaced_and_counted() -> None:
    """Its header parses (so it travels undecoded) but its scan is missing: the device decode fails,
    the row takes the previous good image and its draws, and the batch keeps its size."""
    good = photos(3, seed=5)
    host, stage = HostStage(SMALL), DeviceStage(SMALL, "cpu")
    items = [(host(d), i) for i, d in enumerate(good)]
    scan = good[1].index(b"\xff\xda")  # start of scan: the header ends here
    bad = host(good[1][:scan] + b"\x00" * 3000 + b"\xff\xd9")  # no scan at all
    assert bad.encoded
    items[1] = (bad, 1)
    batch, _ = collate_host(items)
    with pytest.warns(UserWarning, match="did not decode"):
        views = stage(batch)
    assert stage.corrupt == 1
    for view in views:
        assert view.shape[0] == 3 and torch.equal(view[1], view[0])


def test_decode_device_is_refused_where_it_does_not_apply() -> None:
    with pytest.raises(ConfigError, match="data.views_on=device is for the formats"):
        DataConfig(views_on="device").validate()
    with pytest.raises(ConfigError, match="data.views_on='gpu' is not one of"):
        DataConfig(format="imagefolder", path="x", views_on="gpu").validate()
    with pytest.raises(ConfigError, match="data.augment='tensor' does not go with it"):
        DataConfig(format="imagefolder", path="x", views_on="device", augment="tensor").validate()
    with pytest.raises(ConfigError, match="data.jpeg_decoder"):
        DataConfig(format="imagefolder", path="x", views_on="device", jpeg_decoder="nvjpeg").validate()


# ------------------------------------------------------------------- loaders ------------------------
@pytest.fixture(scope="module")
def photo_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ImageFolder of 24 photos in 2 classes and WebDataset shards of the same files (keys = names)."""
    root = tmp_path_factory.mktemp("photos")
    with tarfile.open(root / "shard-000000.tar", "w") as tar:
        for i, data in enumerate(photos(24, seed=6)):
            (root / "folder" / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
            (root / "folder" / f"c{i % 2}" / f"img_{i:03d}.jpg").write_bytes(data)
            for name, payload in ((f"img_{i:03d}.jpg", data), (f"img_{i:03d}.cls", str(i % 2).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    return root


def _loader(fmt: str, root: Path, decode: str, rank: int = 0, world: int = 1, workers: int = 0) -> Any:
    path = root / "folder" if fmt == "imagefolder" else root / "shard-000000.tar"
    cfg = DataConfig(format=fmt, path=str(path), views_on=decode, global_batch_size=8, num_workers=workers,
                     num_local_views=2, global_crop_size=32, local_crop_size=16, num_classes=2,
                     webdataset=WebDatasetOptions(shuffle_buffer=0))
    return build_train_loader(cfg, rank=rank, world_size=world, seed=SEED, device=torch.device("cpu"))


def test_imagefolder_on_the_device_keeps_the_world_size_invariance(photo_folder: Path) -> None:
    one = list(_loader("imagefolder", photo_folder, "device", workers=2))
    ranks = [list(_loader("imagefolder", photo_folder, "device", rank=r, world=2)) for r in range(2)]
    assert len(one) == 3 and [len(r) for r in ranks] == [3, 3]
    for t, (views, labels) in enumerate(one):
        assert torch.equal(torch.cat([r[t][1] for r in ranks]), labels)
        for v, view in enumerate(views):
            assert view.shape[1:] == ((3, 32, 32) if v < 2 else (3, 16, 16))
            assert torch.equal(torch.cat([r[t][0][v] for r in ranks]), view)


def test_webdataset_device_views_match_the_pil_paths_draws(photo_folder: Path) -> None:
    """Both paths key each sample's draws by its key: the same samples, the same decisions, close pixels."""
    pil = list(_loader("webdataset", photo_folder, "workers"))
    dev = list(_loader("webdataset", photo_folder, "device"))
    assert len(pil) == len(dev) == 3
    for (pv, pl), (dv, dl) in zip(pil, dev):
        assert torch.equal(pl, dl)
        for a, b in zip(pv, dv):
            assert a.shape == b.shape and float(_levels(PRESETS["default"], a, b).mean()) < 3.0


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_nvjpeg_views_agree_with_the_cpu_device_path() -> None:
    """The same batch through the CUDA stage (nvJPEG, float resize) and the CPU stage (libjpeg-turbo, 8-bit
    resize): the same shapes and decisions, pixels within decoder and rounding differences."""
    data = photos(16, seed=7)
    host = HostStage(SMALL)
    items = []
    for i, d in enumerate(data):
        with seeded_global_rngs(SEED, EPOCH, i):
            items.append((host(d), i))
    batch, _ = collate_host(items)
    cpu = DeviceStage(SMALL, "cpu")(batch)
    gpu_stage = DeviceStage(SMALL, "cuda")
    gpu = gpu_stage(batch)
    torch.cuda.synchronize()
    assert gpu_stage.corrupt == 0
    for a, b in zip(cpu, gpu):
        assert b.is_cuda and b.dtype == torch.float32 and a.shape == b.shape
        assert float(_levels(SMALL, a, b.cpu()).mean()) < 2.0
